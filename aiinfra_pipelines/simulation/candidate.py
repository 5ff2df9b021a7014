"""The engines regression simulation drives: the published candidate, production, model zero.

The candidate is what would ship: ``candidates/latest.json`` names the model version, its
manifest's ``ship`` entry names the engine file on ``main`` and its SHA-256 (docs/loop.md). The
bytes are verified against that hash before a single scenario runs — simulating a file other
than the one certification will vouch for would make the report worthless. Production — the
reference the candidate is gated against — is the release its offline evaluation was judged
against (:func:`load_reference`; the bootstrap engine before the first release).
Model zero is the bootstrap engine itself, driven in every report as the floor (the oracle,
ground-truth perception, needs no engine).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.lake.layout import (
    LATEST_CANDIDATE_KEY,
    MAIN_BRANCH,
    candidate_manifest_key,
    candidate_report_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION, bootstrap_onnx

from .runner import EngineSource

REPORT_GATE = "regression_simulation"
OFFLINE = "offline_eval"  # the report whose reference_version pins the simulation's reference


class CandidateError(ValueError):
    """The candidate to simulate is missing, incomplete or its engine does not match."""


@dataclass(frozen=True)
class Candidate:
    model_version: str
    manifest: dict[str, Any]
    engine: EngineSource

    @property
    def mlflow_run_id(self) -> str | None:
        return self.manifest.get("mlflow_run_id")


def report_key(model_version: str, gate: str = REPORT_GATE) -> str:
    """Where a candidate's gate report lives; simulation's own gate unless told otherwise."""
    return candidate_report_key(model_version, gate)


def latest_candidate_version(lake: VersionedLake, ref: str = MAIN_BRANCH) -> str | None:
    """The newest published candidate's model version, or ``None`` before the first one."""
    if not lake.object_exists(ref, LATEST_CANDIDATE_KEY):
        return None
    latest = lake.get_json(ref, LATEST_CANDIDATE_KEY)
    if "model_version" not in latest:
        raise CandidateError(f"{LATEST_CANDIDATE_KEY} has no model_version: {latest}")
    return str(latest["model_version"])


def load_candidate(
    lake: VersionedLake, model_version: str | None = None, ref: str = MAIN_BRANCH
) -> Candidate:
    """The ship engine of ``model_version`` (default: the latest candidate), hash-verified."""
    version = model_version or latest_candidate_version(lake, ref)
    if version is None:
        raise CandidateError(
            f"no candidate to simulate: {LATEST_CANDIDATE_KEY} is not on {ref} "
            "(materialize published_engine first)"
        )
    key = candidate_manifest_key(version)
    if not lake.object_exists(ref, key):
        raise CandidateError(f"candidate {version}: manifest {key} is not on {ref}")
    manifest = lake.get_json(ref, key)
    ship = manifest.get("ship") or {}
    if not ship.get("key") or not ship.get("sha256"):
        raise CandidateError(f"candidate {version}: manifest {key} has no ship.key / ship.sha256")
    if not lake.object_exists(ref, ship["key"]):
        raise CandidateError(f"candidate {version}: ship engine {ship['key']} is not on {ref}")
    onnx_bytes = lake.get_object(ref, ship["key"])
    digest = hashlib.sha256(onnx_bytes).hexdigest()
    if digest != ship["sha256"]:
        raise CandidateError(
            f"candidate {version}: {ship['key']} has sha256 {digest[:16]}…, the manifest says "
            f"{str(ship['sha256'])[:16]}… — refusing to simulate an engine that would not ship"
        )
    return Candidate(
        model_version=version, manifest=manifest, engine=EngineSource(version, onnx_bytes)
    )


def load_reference(lake: VersionedLake, candidate_version: str) -> EngineSource:
    """The engine a candidate is gated against: the release its offline evaluation judged it
    against (``reference_version`` of its ``offline_eval`` report: ``None`` there means a
    first release, judged against the bootstrap engine), so both gates compare with the same
    release whatever the rollout did in between — a step acts on the materialization upstream
    of it, not on what is newest when it runs. Without that report (a candidate published
    before the field, or by hand) the reference release on the fleet now
    (``release.reference``)."""
    report = lake.get_json_or_none(MAIN_BRANCH, candidate_report_key(candidate_version, OFFLINE))
    if report is not None and "reference_version" in report:
        version = report["reference_version"]
        if version is None:
            return load_model_zero()
        return load_candidate(lake, str(version)).engine
    from aiinfra_pipelines.release.reference import reference_release

    reference = reference_release(lake, excluding=candidate_version)
    if reference is None:  # no production pointer either: the fleet runs the bootstrap engine
        return load_model_zero()
    onnx_bytes = lake.get_object(reference.get("commit", MAIN_BRANCH), reference["onnx_key"])
    return EngineSource(str(reference["version"]), onnx_bytes)


def load_model_zero() -> EngineSource:
    """Model zero, the bootstrap engine the loop started from (cached ONNX export)."""
    return EngineSource(BOOTSTRAP_VERSION, bootstrap_onnx(perception_spec()))
