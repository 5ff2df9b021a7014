"""Dagster metadata of the operations assets: the tables and figures an operator reads.

Kept apart from the assets so each asset body says what it publishes; metadata keys are part of
the UI contract and stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.metadata_tables import markdown_table as literal_markdown
from aiinfra_pipelines.metadata_tables import table_metadata
from aiinfra_pipelines.release.shadow import shadow_agreement

from .outbox_telemetry import outbox_by_vehicle
from .telemetry_intake import ValidatedBatch, telemetry_summary

QUARANTINE_COLUMNS = ["source_key", "record_index", "reason_codes", "reasons"]


def markdown_table(table: pd.DataFrame, limit: int | None = None) -> dg.MetadataValue:
    """A DataFrame (its first ``limit`` rows) as markdown; ``none`` when empty."""
    shown = table if limit is None else table.head(limit)
    return dg.MetadataValue.md(literal_markdown(shown) if len(shown) else "none")


def telemetry_metadata(
    batch: ValidatedBatch,
    quarantine_listed: int,
    source_commit: str,
    main_commit: str,
    records_ref: str,
) -> dict[str, Any]:
    """``fleet_telemetry``'s metadata: counts, reasons, per-model summary, shadow and outbox."""
    return {
        "accepted": len(batch.accepted),
        "quarantined": len(batch.quarantined),
        "frames": int(batch.accepted["frames"].sum()) if len(batch.accepted) else 0,
        "reasons": dg.MetadataValue.json(batch.reason_counts),
        "quarantine": markdown_table(batch.quarantined[QUARANTINE_COLUMNS], quarantine_listed),
        "by_model_and_version": markdown_table(telemetry_summary(batch.accepted)),
        # Cars that ran a candidate in shadow mode: how often it would have decided the same.
        "shadow_mode": dg.MetadataValue.json(shadow_agreement(batch.accepted)),
        # Each car's upload outbox: backlog, bytes per priority, evictions, pulls it served.
        "outbox_by_vehicle": markdown_table(outbox_by_vehicle(batch.accepted)),
        "source_commit": source_commit,
        "main_commit": main_commit,
        "records": records_ref,
    }


def drift_metadata(
    verdict: Mapping[str, Any],
    identity: Mapping[str, Any],
    reference_frames: int,
    current_frames: int,
    commit: str,
) -> dict[str, Any]:
    """``drift_monitor``'s metadata: verdict, per-signal metrics and what was compared."""
    table = pd.DataFrame(
        [{"signal": name, **values} for name, values in sorted(verdict["metrics"].items())]
    )
    return {
        "verdict_id": verdict["id"],
        "drifted": verdict["drifted"],
        "signals": dg.MetadataValue.json(verdict["signals"]),
        "reason": verdict["reason"],
        "metrics": markdown_table(table),
        "reference": f"{identity['dataset_version']} ({reference_frames} frames)",
        "recent": f"{len(identity['recent_logs'])} logs ({current_frames} frames)",
        "main_commit": commit,
    }


def drift_check_result(check_name: str, verdict: Mapping[str, Any]) -> dg.AssetCheckResult:
    """The drift check: a warning (not a failure) when any signal drifted."""
    return dg.AssetCheckResult(
        check_name=check_name,
        passed=not verdict["drifted"],
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "signals": dg.MetadataValue.json(verdict["signals"]),
            "reason": verdict["reason"],
            "insufficient_data": verdict["insufficient"],
        },
    )


def ledger_group_table(by_group: pd.DataFrame) -> dg.TableMetadataValue:
    """CPU/GPU seconds, steps and runs per asset group as a typed Dagster table."""
    columns = ("group", "cpu_seconds", "gpu_seconds", "steps", "runs")
    return table_metadata(
        [
            {
                "group": str(row["group"]),
                "cpu_seconds": round(float(row["cpu_seconds"]), 3),
                "gpu_seconds": round(float(row["gpu_seconds"]), 3),
                "steps": int(row["steps"]),
                "runs": int(row["runs"]),
            }
            for row in by_group.to_dict(orient="records")
        ],
        columns=columns,
    )


def ledger_metadata(
    costs: pd.DataFrame,
    by_group: pd.DataFrame,
    by_asset: pd.DataFrame,
    runs: int,
    commit: str,
    ledger_ref: str,
) -> dict[str, Any]:
    """``compute_cost_ledger``'s metadata: totals, the per-group table, per-asset detail."""
    return {
        "runs": runs,
        "cpu_seconds": round(float(costs.loc[costs["compute"] == "cpu", "seconds"].sum()), 3),
        "gpu_seconds": round(float(costs.loc[costs["compute"] == "gpu", "seconds"].sum()), 3),
        "by_group": ledger_group_table(by_group),
        "by_asset_partition": markdown_table(by_asset.round(3), 100),
        "main_commit": commit,
        "ledger": ledger_ref,
    }
