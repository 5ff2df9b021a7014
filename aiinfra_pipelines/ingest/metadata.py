"""Dagster metadata of the ingest outputs: the verdict table an operator triages a batch by.

Kept apart from the multi-asset so its body says what it computes; the quarantine listing (every
rejected log with its reason codes) is what an operator opens first when a batch goes wrong.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import pandas as pd

from .batch import BatchResult
from .verdicts import ACCEPTED, ALREADY_INGESTED, DUPLICATE, QUARANTINED


def verdict_table_markdown(result: BatchResult, rows: int) -> str:
    """The first ``rows`` logs with verdict, frames and reasons (or what they duplicate)."""
    lines = ["| log | verdict | frames | reasons / duplicate of |", "| --- | --- | --- | --- |"]
    for outcome in result.outcomes[:rows]:
        detail = ",".join(code for code, _ in outcome.reasons) or outcome.duplicate_of
        lines.append(
            f"| `{outcome.location.key}` | {outcome.verdict} | {outcome.frames} | "
            f"{detail.replace('|', '/')} |"
        )
    if len(result.outcomes) > rows:
        lines.append(f"| … {len(result.outcomes) - rows} more in the table | | | |")
    return "\n".join(lines)


def validated_logs_metadata(result: BatchResult, rows: int, workers: int) -> dict[str, Any]:
    """``validated_drive_logs``' metadata: counts per verdict, the table, quarantined keys."""
    counts = result.counts()
    keys_by = {v: [o.location.key for o in result.by_verdict(v)] for v in counts}
    return {
        **{f"logs_{verdict}": count for verdict, count in counts.items()},
        "verdicts": dg.MetadataValue.md(verdict_table_markdown(result, rows)),
        "accepted": dg.MetadataValue.json(keys_by[ACCEPTED]),
        "quarantined": dg.MetadataValue.json(keys_by[QUARANTINED]),
        "duplicates": dg.MetadataValue.json(keys_by[DUPLICATE] + keys_by[ALREADY_INGESTED]),
        "index_only_segments": sum(
            o.kind == "index" and o.verdict == ACCEPTED for o in result.outcomes
        ),
        "workers": workers,
    }


def scene_index_metadata(index: pd.DataFrame) -> dict[str, Any]:
    """``scene_index``' metadata: frames and how they spread over slices."""
    slices = index["slice"].value_counts().to_dict() if len(index) else {}
    return {
        "frames": len(index),
        "slices": dg.MetadataValue.json({str(k): int(v) for k, v in slices.items()}),
        "dagster/row_count": len(index),
    }
