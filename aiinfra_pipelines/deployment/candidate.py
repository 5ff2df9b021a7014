"""The candidate's place in the lake and its manifest (docs/loop.md, "Lake layout").

Everything a later layer needs to verify a candidate without trusting the run that made it:
engine files by key and SHA-256, the gate reports by key, SHA-256 of their stored bytes and
verdict, and the lineage (model version, MLflow run, dataset commit, code version).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CANDIDATES_PREFIX = "candidates/"
LATEST_KEY = f"{CANDIDATES_PREFIX}latest.json"
IDENTITY_FIELDS: tuple[str, ...] = (
    "model_version",
    "registered_model",
    "mlflow_run_id",
    "model_uri",
    "dataset_version",
    "dataset_commit",
    "code_version",
)


def candidate_prefix(model_version: str) -> str:
    return f"{CANDIDATES_PREFIX}{model_version}/"


def engine_key(model_version: str, precision: str) -> str:
    return f"{candidate_prefix(model_version)}{precision}.onnx"


def report_key(model_version: str, gate: str) -> str:
    return f"{candidate_prefix(model_version)}reports/{gate}.json"


def manifest_key(model_version: str) -> str:
    return f"{candidate_prefix(model_version)}manifest.json"


def json_bytes(value: Any) -> bytes:
    """The one encoding of manifests and reports (their SHA-256 is over exactly these bytes)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode()


def identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage fields of a ``trained_model`` output (or anything carrying them)."""
    if not model.get("model_version"):
        raise ValueError(
            "the trained model has no registry version (model_version): it was trained before "
            "registration existed; retrain it so the candidate has an identity"
        )
    return {name: model.get(name, "") for name in IDENTITY_FIELDS}


def build_manifest(
    lineage: Mapping[str, Any],
    engines: Mapping[str, Mapping[str, Any]],
    ship: Mapping[str, Any],
    reports: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The candidate manifest: ``engines`` by precision (fp32 is also ``onnx``), ``reports`` by
    gate (each ``{key, sha256, passed}``), ``ship`` = the engine the target runs."""
    missing = {"fp32", "fp16", "int8"} - set(engines)
    if missing:
        raise ValueError(f"candidate manifest needs every engine; missing {sorted(missing)}")
    failed = [gate for gate, report in reports.items() if not report.get("passed")]
    if failed:
        raise ValueError(f"refusing to write a candidate manifest with failed gates {failed}")
    return {
        **{name: lineage.get(name, "") for name in IDENTITY_FIELDS},
        "onnx": {"key": engines["fp32"]["key"], "sha256": engines["fp32"]["sha256"]},
        "engines": {precision: dict(entry) for precision, entry in engines.items()},
        "ship": dict(ship),
        "reports": {gate: dict(report) for gate, report in reports.items()},
    }
