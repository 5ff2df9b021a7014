"""Write–audit–publish of a candidate: engines, gate reports and manifest onto ``main``.

What ``published_engine`` does, without Dagster around it. Nothing reaches ``main`` unless the
parity and latency audits passed on exactly the reports staged, and the offline evaluation on
record is of this candidate's MLflow run; then one merge carries everything the manifest names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from aiinfra_pipelines.lake.audits import RequiredAudit, verify_audits
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import (
    LATEST_CANDIDATE_KEY,
    candidate_manifest_key,
    candidate_report_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_with_run_branch
from aiinfra_pipelines.training.identity import CandidateIdentity

from .candidate import build_manifest
from .payloads import StagedObject
from .reports import BENCHMARK_GATE, PARITY_GATE
from .settings import DeploymentSettings, environment_target
from .staging import read_staged

PARITY_CHECK = "engine_parity_within_budget"
LATENCY_CHECK = "engine_benchmark_within_latency_budget"
OFFLINE_GATE = "offline_eval"
MANIFEST_ENGINE_FIELDS = ("key", "sha256", "bytes", "precision_plan")


@dataclass(frozen=True)
class PublishedCandidate:
    """A candidate merged onto ``main``: the merge commit and the manifest it carries."""

    model_version: str
    commit: str
    manifest: dict[str, Any]
    manifest_sha256: str

    @property
    def shipped(self) -> dict[str, Any]:
        """The engine the target runs (the manifest's ``ship`` entry)."""
        return self.manifest["ship"]

    def registry_tags(self) -> dict[str, str]:
        """The hashes the registry version carries, so MLflow names what ``main`` holds."""
        engines = self.manifest["engines"]
        return {
            "onnx_sha256": engines["fp32"]["sha256"],
            "engine_sha256": self.shipped["sha256"],
            "engine_fp16_sha256": engines["fp16"]["sha256"],
            "candidate_manifest_sha256": self.manifest_sha256,
            "candidate_commit": self.commit,
        }


def offline_report(offline_eval: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The offline gate's verdict as a candidate report (the other gates stage their own)."""
    return {
        "gate": OFFLINE_GATE,
        "model_version": version,
        "passed": bool(offline_eval["passed"]),
        "failures": offline_eval.get("failures", []),
        "notes": offline_eval.get("notes", []),
        "has_production": offline_eval.get("has_production"),
        "reference_version": offline_eval.get("reference_version"),
        "benchmark_version": offline_eval.get("benchmark_version"),
        "mlflow_run_id": offline_eval.get("mlflow_run_id"),
        "candidate": offline_eval.get("candidate", []),
        # The rules it was judged under (gate_rules), as every gate report names them.
        **{key: offline_eval.get(key) for key in ("gates_version", "gates_sha256", "calibration")},
    }


def require_gates(
    lake: VersionedLake,
    root_run_id: str,
    offline_eval: Mapping[str, Any],
    onnx_model: Mapping[str, Any],
    engine_parity: Mapping[str, Any],
    engine_benchmark: Mapping[str, Any],
) -> None:
    """Refuse to publish unless both audits passed on the staged reports and the offline
    evaluation on record is of this candidate's MLflow run."""
    verify_audits(
        lake,
        root_run_id,
        [
            RequiredAudit("engine_parity", PARITY_CHECK, engine_parity["report"]["key"]),
            RequiredAudit("engine_benchmark", LATENCY_CHECK, engine_benchmark["report"]["key"]),
        ],
        None,
    )
    if offline_eval.get("mlflow_run_id") != onnx_model["mlflow_run_id"]:
        raise ValueError(
            f"the offline_eval on record is of MLflow run {offline_eval.get('mlflow_run_id')}, "
            f"not of candidate v{onnx_model['model_version']} ({onnx_model['mlflow_run_id']})"
        )


def gate_reports(
    lake: VersionedLake,
    version: str,
    offline: Mapping[str, Any],
    offline_bytes: bytes,
    engine_parity: Mapping[str, Any],
    engine_benchmark: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    """``{gate: {key, sha256, passed}}``: the SHA-256 is over the bytes as stored."""
    reports = {
        OFFLINE_GATE: {
            "key": candidate_report_key(version, OFFLINE_GATE),
            "sha256": hashlib.sha256(offline_bytes).hexdigest(),
            "passed": offline["passed"],
        },
    }
    for gate, output in ((PARITY_GATE, engine_parity), (BENCHMARK_GATE, engine_benchmark)):
        stored = read_staged(lake, output["report"])
        reports[gate] = {
            "key": output["report"]["key"],
            "sha256": hashlib.sha256(stored).hexdigest(),
            "passed": bool(output["passed"]),
        }
    return reports


def manifest_engines(
    onnx_model: Mapping[str, Any], quantized_engine: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Every engine by precision as the manifest lists it (no staging commit: it is on main)."""
    return {
        "fp32": StagedObject.from_dict(onnx_model["onnx"]).manifest_entry(),
        **{
            precision: {k: v for k, v in entry.items() if k in MANIFEST_ENGINE_FIELDS}
            for precision, entry in quantized_engine["engines"].items()
        },
    }


def shipped_precision(engine_parity: Mapping[str, Any], engine_benchmark: Mapping[str, Any]) -> str:
    """The precision both gates judged: engine_parity chose it, engine_benchmark timed it."""
    chosen, timed = engine_parity.get("ship_precision"), engine_benchmark.get("ship_precision")
    if chosen is None or chosen != timed:
        raise ValueError(
            f"engine_parity chose {chosen} but engine_benchmark gated {timed}: "
            "rematerialize engine_benchmark from this engine_parity"
        )
    return str(chosen)


def selection_summary(
    engine_parity: Mapping[str, Any], quantized_engine: Mapping[str, Any]
) -> dict[str, Any]:
    """How the shipped engine was chosen (engine_parity's selection), and why no INT8 engine
    exists when quantization could not make one."""
    refused = quantized_engine.get("int8_refused")
    return {
        **engine_parity["selection"],
        **({} if refused is None else {"int8_refused": refused["error"]}),
    }


def publish_candidate(
    lake: VersionedLake,
    root_run_id: str,
    dagster_run_id: str,
    offline_eval: Mapping[str, Any],
    onnx_model: Mapping[str, Any],
    quantized_engine: Mapping[str, Any],
    engine_parity: Mapping[str, Any],
    engine_benchmark: Mapping[str, Any],
) -> PublishedCandidate:
    """Merge the run branch (engines, gate reports) onto ``main`` with the candidate manifest
    and the ``latest`` pointer, in one commit — only behind passing gates."""
    version = str(onnx_model["model_version"])
    require_gates(lake, root_run_id, offline_eval, onnx_model, engine_parity, engine_benchmark)
    offline = offline_report(offline_eval, version)
    offline_bytes = json_document(offline)
    reports = gate_reports(lake, version, offline, offline_bytes, engine_parity, engine_benchmark)
    target = environment_target(DeploymentSettings.load())
    engines = manifest_engines(onnx_model, quantized_engine)
    precision = shipped_precision(engine_parity, engine_benchmark)
    shipped = engines[precision]
    manifest = build_manifest(
        CandidateIdentity.from_dict(onnx_model).to_dict(),
        engines,
        ship={
            "precision": precision,
            "key": shipped["key"],
            "sha256": shipped["sha256"],
            "target": target.runtime_target,
        },
        reports=reports,
        selection=selection_summary(engine_parity, quantized_engine),
    )
    manifest_bytes = json_document(manifest)
    # The run branch holds the engines and gate reports the manifest names: one merge.
    commit = publish_with_run_branch(
        lake,
        root_run_id,
        {
            candidate_report_key(version, OFFLINE_GATE): offline_bytes,
            candidate_manifest_key(version): manifest_bytes,
            LATEST_CANDIDATE_KEY: json_document(
                {"model_version": version, "manifest_key": candidate_manifest_key(version)}
            ),
        },
        f"candidate v{version}: engines, reports and manifest",
        {"kind": "candidate", "model_version": version, "dagster_run_id": dagster_run_id},
    )
    return PublishedCandidate(
        model_version=version,
        commit=commit,
        manifest=manifest,
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
    )


def published_metadata(published: PublishedCandidate, repository: str) -> dict[str, Any]:
    """``published_engine``'s metadata: where the manifest is on ``main`` and what ships."""
    key = candidate_manifest_key(published.model_version)
    return {
        "model_version": published.model_version,
        "main_commit": published.commit,
        "manifest": key,
        "manifest_sha256": published.manifest_sha256,
        "engine_sha256": published.shipped["sha256"],
        "ship": dg.MetadataValue.json(published.manifest["ship"]),
        "lake_ref": f"lakefs://{repository}/{published.commit}/{key}",
    }
