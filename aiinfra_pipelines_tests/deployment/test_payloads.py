"""The typed deployment payloads keep today's JSON, and the publish path works on a real lake.

Fast: no network, no engines — staged bytes stand in for ONNX files. The slow
``test_deployment_assets`` drives the same code through Dagster with real engines.
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import dagster as dg
import pytest

from aiinfra_pipelines.deployment.candidate import identity
from aiinfra_pipelines.deployment.payloads import StagedObject
from aiinfra_pipelines.deployment.publishing import (
    LATENCY_CHECK,
    PARITY_CHECK,
    manifest_engines,
    publish_candidate,
)
from aiinfra_pipelines.deployment.staging import read_staged, stage_objects
from aiinfra_pipelines.lake.audits import record_audit
from aiinfra_pipelines.lake.layout import (
    LATEST_CANDIDATE_KEY,
    MAIN_BRANCH,
    candidate_engine_key,
    candidate_manifest_key,
    candidate_report_key,
)
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import ensure_run_branch
from aiinfra_pipelines.training.identity import IDENTITY_FIELDS, CandidateIdentity

LINEAGE = {
    "model_version": "7",
    "registered_model": "perception",
    "mlflow_run_id": "run-7",
    "model_uri": "models:/perception/7",
    "dataset_version": "dataset-v0003",
    "dataset_commit": "c0ffee",
    "code_version": "abc123",
}


def test_identity_round_trips_to_the_same_fields_in_the_same_order():
    model = {**LINEAGE, "epochs": 3, "metrics": {"f1": 0.9}}
    parsed = CandidateIdentity.from_dict(model)
    assert parsed.model_version == "7" and parsed.dataset_commit == "c0ffee"
    assert parsed.to_dict() == LINEAGE
    assert list(parsed.to_dict()) == list(IDENTITY_FIELDS) == list(LINEAGE)
    assert identity(model) == LINEAGE


def test_identity_fills_missing_lineage_with_empty_strings_and_refuses_no_version():
    assert CandidateIdentity.from_dict({"model_version": "1"}).to_dict() == {
        name: ("1" if name == "model_version" else "") for name in IDENTITY_FIELDS
    }
    with pytest.raises(ValueError, match="no registry version"):
        CandidateIdentity.from_dict({"registered_model": "perception"})


def test_staged_object_keeps_the_bytes_field_name_and_ignores_extras():
    entry = {"key": "k", "sha256": "s", "bytes": 3, "commit": "c", "precision_plan": {}}
    staged = StagedObject.from_dict(entry)
    assert staged.size == 3
    assert staged.to_dict() == {"key": "k", "sha256": "s", "bytes": 3, "commit": "c"}
    assert staged.manifest_entry() == {"key": "k", "sha256": "s", "bytes": 3}


def _context(run_id: str = "r1", asset: str = "onnx_model") -> SimpleNamespace:
    run = SimpleNamespace(run_id=run_id, root_run_id=None)
    return SimpleNamespace(run=run, asset_key=dg.AssetKey(asset))


def _staged_candidate(lake, precisions, ship_precision, *, timed=None):
    """Engines staged for ``precisions`` (fp32 always) and both gate reports audited, the
    parity report having chosen ``ship_precision`` and the benchmark timed ``timed``."""
    context = _context()
    engines = {p: f"{p} engine".encode() for p in ("fp32", *precisions)}
    staged = stage_objects(
        lake, context, {candidate_engine_key("7", p): data for p, data in engines.items()}, "m"
    )
    onnx_model = {**LINEAGE, "onnx": staged[candidate_engine_key("7", "fp32")].to_dict()}
    quantized = {
        **LINEAGE,
        "engines": {
            p: {
                **staged[candidate_engine_key("7", p)].to_dict(),
                **({"precision_plan": {}} if p == "int8" else {}),
            }
            for p in precisions
        },
        **({} if "int8" in precisions else {"int8_refused": {"error": "QAT breached night"}}),
    }
    selection = {"rule": "smallest", "allowed": ["int8", "fp16"], "choice": ship_precision}
    outputs = {}
    for gate, check, asset, shipped in (
        ("engine_parity", PARITY_CHECK, "engine_parity", ship_precision),
        ("engine_benchmark", LATENCY_CHECK, "engine_benchmark", timed or ship_precision),
    ):
        key = candidate_report_key("7", gate)
        body = {"passed": True, "ship_precision": shipped, "selection": selection}
        report = stage_objects(lake, _context(asset=asset), {key: json.dumps(body).encode()}, gate)
        outputs[gate] = {
            "model_version": "7",
            "passed": True,
            "ship_precision": shipped,
            "selection": selection,
            "report": report[key].to_dict(),
        }
        record_audit(
            lake,
            "r1",
            asset=asset,
            check=check,
            partition=None,
            audited_key=key,
            passed=True,
            dagster_run_id="r1",
        )
    return engines, onnx_model, quantized, outputs


def _publish(lake, onnx_model, quantized, outputs):
    offline_eval = {"passed": True, "mlflow_run_id": "run-7", "failures": []}
    return publish_candidate(
        lake,
        "r1",
        "r1",
        offline_eval,
        onnx_model,
        quantized,
        outputs["engine_parity"],
        outputs["engine_benchmark"],
    )


def test_a_candidate_is_staged_audited_and_published_in_one_merge(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    engines, onnx_model, quantized, outputs = _staged_candidate(lake, ("fp16", "int8"), "int8")
    staged_fp32 = StagedObject.from_dict(onnx_model["onnx"])
    assert read_staged(lake, staged_fp32) == engines["fp32"]
    assert read_staged(lake, quantized["engines"]["fp16"]) == b"fp16 engine"

    published = _publish(lake, onnx_model, quantized, outputs)

    manifest_bytes = lake.get_object(MAIN_BRANCH, candidate_manifest_key("7"))
    assert json.loads(manifest_bytes) == published.manifest
    assert hashlib.sha256(manifest_bytes).hexdigest() == published.manifest_sha256
    assert published.manifest["engines"] == manifest_engines(onnx_model, quantized)
    assert published.manifest["engines"]["int8"]["precision_plan"] == {}
    assert "commit" not in published.manifest["engines"]["fp32"]
    assert {k: published.manifest[k] for k in IDENTITY_FIELDS} == LINEAGE
    assert published.manifest["ship"]["precision"] == "int8"
    assert published.manifest["ship"]["sha256"] == hashlib.sha256(engines["int8"]).hexdigest()
    assert published.manifest["selection"]["choice"] == "int8"
    assert "int8_refused" not in published.manifest["selection"]
    assert lake.get_json(MAIN_BRANCH, LATEST_CANDIDATE_KEY) == {
        "model_version": "7",
        "manifest_key": candidate_manifest_key("7"),
    }
    tags = published.registry_tags()
    assert tags["onnx_sha256"] == hashlib.sha256(engines["fp32"]).hexdigest()
    assert tags["engine_sha256"] == published.manifest["ship"]["sha256"]
    assert tags["candidate_commit"] == published.commit


def test_a_candidate_without_an_int8_engine_ships_the_engine_parity_chose(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    engines, onnx_model, quantized, outputs = _staged_candidate(lake, ("fp16",), "fp16")

    published = _publish(lake, onnx_model, quantized, outputs)

    manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key("7"))
    assert set(manifest["engines"]) == {"fp32", "fp16"}
    assert manifest["ship"]["precision"] == "fp16"
    assert manifest["ship"]["key"] == candidate_engine_key("7", "fp16")
    assert manifest["ship"]["sha256"] == hashlib.sha256(engines["fp16"]).hexdigest()
    assert manifest["selection"]["int8_refused"] == "QAT breached night"
    assert published.registry_tags()["engine_sha256"] == manifest["ship"]["sha256"]


def test_publishing_refuses_when_the_benchmark_timed_another_engine_than_parity_chose(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    _, onnx_model, quantized, outputs = _staged_candidate(
        lake, ("fp16", "int8"), "fp16", timed="int8"
    )
    with pytest.raises(
        ValueError, match="engine_parity chose fp16 but engine_benchmark gated int8"
    ):
        _publish(lake, onnx_model, quantized, outputs)
    assert not lake.object_exists(MAIN_BRANCH, candidate_manifest_key("7"))


def test_publishing_refuses_a_candidate_whose_gates_never_ran(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    ensure_run_branch(lake, "r1")
    report = {"report": {"key": "missing"}, "passed": True, "model_version": "7"}
    with pytest.raises(Exception, match="never ran"):
        publish_candidate(lake, "r1", "r1", {"mlflow_run_id": "other"}, LINEAGE, {}, report, report)
