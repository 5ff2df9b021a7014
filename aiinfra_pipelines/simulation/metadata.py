"""Dagster metadata of the simulation assets: the tables an operator reads in the UI.

Kept apart from the assets so their bodies say what they compute; metadata keys are part of
the UI contract (the regression check reads ``commit`` and ``report_key`` back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from aiinfra_pipelines.metadata_tables import table_metadata

from .regression import HEADLINE_KEYS
from .report_view import report_table_rows, verdict_explained
from .roles import ROLE_CANDIDATE, ROLES


def shard_outcome_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per scenario of a shard: collisions and at-fault counts per role, cache hits."""
    return [
        {
            "scenario": row["scenario_id"],
            "slice": row["slice"],
            "seeds": len(row["seeds"]),
            **{
                f"{role} collisions": sum(bool(e["collision"]) for e in row[role]) for role in ROLES
            },
            **{
                f"{role} at-fault": sum(bool(e.get("at_fault_collision")) for e in row[role])
                for role in ROLES
            },
            "cand. fallbacks": sum(e["fallback_activations"] for e in row[ROLE_CANDIDATE]),
            "cached": ",".join(role for role, hit in sorted(row["cached"].items()) if hit),
        }
        for row in record["scenarios"]
    ]


def report_metadata(
    report: Mapping[str, Any],
    markdown: str,
    record_changes: Any,
    report_key: str,
    report_sha256: str,
    commit: str,
) -> dict[str, Any]:
    """``regression_report``'s metadata: verdict, where the report is, headline figures."""
    return {
        "model_version": str(report["model_version"]),
        "passed": report["passed"],
        "verdict_explained": dg.MetadataValue.text(verdict_explained(report)),
        "failures": dg.MetadataValue.json(report["failures"]),
        "report_key": report_key,
        "report_sha256": report_sha256,
        "commit": commit,
        "record_changes": dg.MetadataValue.json(record_changes),
        **{
            key: value
            for key, value in report["summary"].items()
            if key in HEADLINE_KEYS and value is not None
        },
        "report": dg.MetadataValue.md(markdown),
        "scenario_table": table_metadata(report_table_rows(report)),
    }
