"""Certification evidence: every required gate re-verified from what is on ``main``.

Collecting evidence trusts no earlier run, only the lake: the candidate manifest, each gate's
report (present, ``passed: true``, for the same model version, byte-identical to the hash the
manifest recorded, judged under the gate rules in force now — the same ``gates_sha256``), the
ONNX and engine files (hashes as the manifest says), and a fresh determinism run of the shipped
engine. Kept apart from signing (``certificate.py``) because
it never stops at the first failure: it gathers every failed gate so one refusal names all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.gate_rules import GateRules, gate_rules
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, candidate_manifest_key, candidate_report_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.contract import perception_spec

from .determinism import GATE as DETERMINISM_GATE
from .determinism import DeterminismResult, DeterminismSettings, check_engine

# The pseudo-gate for the files the certificate vouches for (manifest, ONNX, engine).
ARTIFACTS_GATE = "artifacts"
DEFAULT_REQUIRED_REPORTS = (
    "offline_eval",
    "engine_parity",
    "engine_benchmark",
    "regression_simulation",
)


@dataclass(frozen=True)
class GateFailure:
    gate: str
    reason: str


@dataclass(frozen=True)
class GateEvidence:
    """One gate's report as found on ``main``."""

    gate: str
    key: str
    sha256: str | None
    passed: bool
    in_manifest: bool
    gates_sha256: str | None = None  # the rules the report says judged it


@dataclass
class CandidateEvidence:
    """Everything certification looked at for one model version, and what failed."""

    model_version: str
    manifest_key: str
    manifest: dict[str, Any] | None
    manifest_sha256: str | None
    gates: list[GateEvidence] = field(default_factory=list)
    failures: list[GateFailure] = field(default_factory=list)
    # The shipped engine's determinism check (None: the engine itself failed verification).
    determinism: DeterminismResult | None = None
    # The gate rules in force at certification (every report must name the same).
    rules: GateRules | None = None

    @property
    def passed(self) -> bool:
        return not self.failures


def required_gates() -> list[str]:
    """``resources/gates.yaml`` → ``release.required_reports``: the gates certification needs."""
    release = load_resource_yaml("gates.yaml").get("release") or {}
    gates = release.get("required_reports") or list(DEFAULT_REQUIRED_REPORTS)
    return [str(gate) for gate in gates]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_if_exists(lake: VersionedLake, ref: str, key: str) -> bytes | None:
    return lake.get_object(ref, key) if lake.object_exists(ref, key) else None


def _summarize_failures(report: Mapping[str, Any]) -> str:
    detail = report.get("failures")
    if not detail:
        return ""
    text = json.dumps(detail, sort_keys=True, default=str)
    return f" ({text[:200]}{'…' if len(text) > 200 else ''})"


def _evaluate_report(
    lake: VersionedLake,
    ref: str,
    model_version: str,
    gate: str,
    manifest: Mapping[str, Any] | None,
    evidence: CandidateEvidence,
) -> None:
    listed = ((manifest or {}).get("reports") or {}).get(gate)
    key = (
        str(listed["key"])
        if listed and listed.get("key")
        else candidate_report_key(model_version, gate)
    )
    data = read_if_exists(lake, ref, key)
    if data is None:
        evidence.failures.append(GateFailure(gate, f"report missing ({key})"))
        evidence.gates.append(GateEvidence(gate, key, None, False, listed is not None))
        return
    digest = sha256_hex(data)
    problems: list[str] = []
    try:
        report = json.loads(data)
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        report = {}
        problems.append(f"report unreadable ({error})")
    else:
        if report.get("passed") is not True:
            problems.append(
                f"reported passed={json.dumps(report.get('passed'))}{_summarize_failures(report)}"
            )
        reported_version = report.get("model_version")
        if str(reported_version) != model_version:
            problems.append(
                f"report is for model version {reported_version!r}, not {model_version!r}"
            )
        problems += _rules_problems(report, evidence.rules)
    if listed is not None and listed.get("sha256") != digest:
        problems.append(
            f"sha256 {digest[:12]} does not match the manifest's "
            f"{str(listed.get('sha256'))[:12]} (report changed after publication)"
        )
    for problem in problems:
        evidence.failures.append(GateFailure(gate, problem))
    evidence.gates.append(
        GateEvidence(
            gate, key, digest, not problems, listed is not None, report.get("gates_sha256")
        )
    )


def _rules_problems(report: Mapping[str, Any], rules: GateRules | None) -> list[str]:
    """A report judged under other gate rules than those in force (or naming none) cannot be
    vouched for under these: a certificate says which rules certified it."""
    if rules is None:
        return []
    judged = report.get("gates_sha256")
    if not judged:
        return ["report does not name the gate rules it was judged under (no gates_sha256)"]
    if judged != rules.sha256:
        return [
            f"judged under gate rules {str(judged)[:12]}, not the rules in force "
            f"({rules.version} {rules.sha256[:12]}): re-run the gate"
        ]
    return []


def _evaluate_artifacts(
    lake: VersionedLake, ref: str, manifest: Mapping[str, Any], evidence: CandidateEvidence
) -> None:
    """The ONNX and the shipped engine must be on ``main`` byte for byte as the manifest says."""
    for label, entry in (("onnx", manifest.get("onnx")), ("engine", manifest.get("ship"))):
        if not entry or not entry.get("key") or not entry.get("sha256"):
            evidence.failures.append(
                GateFailure(ARTIFACTS_GATE, f"manifest has no {label} key/sha256")
            )
            continue
        data = read_if_exists(lake, ref, str(entry["key"]))
        if data is None:
            evidence.failures.append(
                GateFailure(ARTIFACTS_GATE, f"{label} missing ({entry['key']})")
            )
        elif sha256_hex(data) != entry["sha256"]:
            evidence.failures.append(
                GateFailure(
                    ARTIFACTS_GATE,
                    f"{label} {entry['key']} has sha256 {sha256_hex(data)[:12]}, the manifest "
                    f"says {str(entry['sha256'])[:12]}",
                )
            )


def _evaluate_determinism(
    lake: VersionedLake,
    ref: str,
    manifest: Mapping[str, Any],
    evidence: CandidateEvidence,
    settings: DeterminismSettings | None,
) -> None:
    """Run the shipped engine (already verified byte for byte) through the determinism check."""
    ship = manifest.get("ship") or {}
    data = read_if_exists(lake, ref, str(ship.get("key") or ""))
    if data is None or sha256_hex(data) != ship.get("sha256"):
        return  # the artifacts gate has named the problem; nothing trustworthy to run
    result = check_engine(
        data, perception_spec(), runtime_target=str(ship.get("target") or ""), settings=settings
    )
    evidence.determinism = result
    if not result.deterministic:
        evidence.failures.append(GateFailure(DETERMINISM_GATE, result.reason))


def collect_evidence(
    lake: VersionedLake,
    model_version: str,
    ref: str = MAIN_BRANCH,
    gates: Iterable[str] | None = None,
    determinism: DeterminismSettings | None = None,
) -> CandidateEvidence:
    """Re-verify every required gate of ``model_version`` from what is on ``ref``, and check
    that the shipped engine is deterministic (``determinism``: gates.yaml when ``None``).

    Never stops at the first failure: the result names every failed gate, so one refusal tells
    the operator everything that must be fixed.
    """
    model_version = str(model_version)
    key = candidate_manifest_key(model_version)
    manifest_bytes = read_if_exists(lake, ref, key)
    manifest: dict[str, Any] | None = None
    evidence = CandidateEvidence(
        model_version=model_version,
        manifest_key=key,
        manifest=None,
        manifest_sha256=sha256_hex(manifest_bytes) if manifest_bytes is not None else None,
        rules=gate_rules(),
    )
    if manifest_bytes is None:
        evidence.failures.append(GateFailure(ARTIFACTS_GATE, f"candidate manifest missing ({key})"))
    else:
        try:
            manifest = json.loads(manifest_bytes)
            if not isinstance(manifest, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            manifest = None
            evidence.failures.append(
                GateFailure(ARTIFACTS_GATE, f"candidate manifest {key} unreadable ({error})")
            )
    if manifest is not None:
        evidence.manifest = manifest
        if str(manifest.get("model_version")) != model_version:
            evidence.failures.append(
                GateFailure(
                    ARTIFACTS_GATE,
                    f"manifest {key} is for model version {manifest.get('model_version')!r}",
                )
            )
        _evaluate_artifacts(lake, ref, manifest, evidence)
        _evaluate_determinism(lake, ref, manifest, evidence, determinism)
    for gate in gates if gates is not None else required_gates():
        _evaluate_report(lake, ref, model_version, gate, manifest, evidence)
    return evidence
