"""The candidate's place in the lake and its manifest (docs/loop.md, "Lake layout").

Everything a later layer needs to verify a candidate without trusting the run that made it:
engine files by key and SHA-256, the gate reports by key, SHA-256 of their stored bytes and
verdict, and the lineage (model version, MLflow run, dataset commit, code version).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiinfra_pipelines.training.identity import IDENTITY_FIELDS, CandidateIdentity


def identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage fields of a ``trained_model`` output (or anything carrying them), as JSON.

    Kept for callers that splice the fields into a dict; typed code uses ``CandidateIdentity``.
    """
    return CandidateIdentity.from_dict(model).to_dict()


def build_manifest(
    lineage: Mapping[str, Any],
    engines: Mapping[str, Mapping[str, Any]],
    ship: Mapping[str, Any],
    reports: Mapping[str, Mapping[str, Any]],
    selection: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The candidate manifest: ``engines`` by precision (fp32 is also ``onnx``), ``reports`` by
    gate (each ``{key, sha256, passed}``), ``ship`` = the engine the target runs and
    ``selection`` = how engine_parity chose it (deployment.selection)."""
    missing = {"fp32", "fp16", str(ship.get("precision"))} - set(engines)
    if missing:
        raise ValueError(
            f"candidate manifest needs FP32, FP16 and the shipped engine; missing {sorted(missing)}"
        )
    failed = [gate for gate, report in reports.items() if not report.get("passed")]
    if failed:
        raise ValueError(f"refusing to write a candidate manifest with failed gates {failed}")
    return {
        **{name: lineage.get(name, "") for name in IDENTITY_FIELDS},
        "onnx": {"key": engines["fp32"]["key"], "sha256": engines["fp32"]["sha256"]},
        "engines": {precision: dict(entry) for precision, entry in engines.items()},
        "ship": dict(ship),
        "reports": {gate: dict(report) for gate, report in reports.items()},
        **({} if selection is None else {"selection": dict(selection)}),
    }
