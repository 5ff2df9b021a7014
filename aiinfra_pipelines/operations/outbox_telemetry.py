"""The car's outbox in its telemetry: backlog, bytes per priority, evictions, served pulls.

Each telemetry record a car sends carries a snapshot of its outbox at send time
(``vehicle.outbox.Outbox.status``), so the platform sees which cars fall behind (backlog),
what their bandwidth goes to (bytes per priority class), what they had to throw away
(evictions) and how they answer pulls. Optional fields: older agents do not send them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

# Published name → the value a missing field means. ``outbox_bytes_sent_by_class`` is an
# object {class: bytes}, published as JSON text (one Parquet column whatever the classes).
OUTBOX_DEFAULTS: dict[str, Any] = {
    "outbox_backlog_logs": 0,
    "outbox_backlog_bytes": 0,
    "outbox_held_logs": 0,
    "outbox_evictions": 0,
    "outbox_pulls_served": 0,
    "outbox_pulls_unservable": 0,
    "outbox_bytes_sent_by_class": {},
}
OUTBOX_COUNTS = tuple(name for name in OUTBOX_DEFAULTS if name != "outbox_bytes_sent_by_class")


def outbox_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    """The telemetry fields of one outbox snapshot (``Outbox.status()``)."""
    backlog = status["backlog"].values()
    return {
        "outbox_backlog_logs": sum(int(entry["logs"]) for entry in backlog),
        "outbox_backlog_bytes": sum(int(entry["bytes"] or 0) for entry in backlog),
        "outbox_held_logs": int(status["held"]["logs"]),
        "outbox_evictions": len(status["evictions"]),
        "outbox_pulls_served": int(status["pulls_served"]),
        "outbox_pulls_unservable": int(status["pulls_unservable"]),
        "outbox_bytes_sent_by_class": {
            str(name): int(value or 0) for name, value in status["bytes_sent_by_class"].items()
        },
    }


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def outbox_problems(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The optional outbox fields, when present, are counts and a {class: bytes} object."""
    problems = [
        ("invalid_count", f"{name} must be a non-negative integer")
        for name in OUTBOX_COUNTS
        if name in record and not _count(record[name])
    ]
    sent = record.get("outbox_bytes_sent_by_class", {})
    if not isinstance(sent, Mapping) or not all(
        isinstance(name, str) and _count(value) for name, value in sent.items()
    ):
        problems.append(
            ("invalid_field", "outbox_bytes_sent_by_class must map class names to byte counts")
        )
    return problems


def published_outbox(record: Mapping[str, Any]) -> dict[str, Any]:
    """The outbox columns of a published row (defaults filled, the object as JSON text)."""
    row = {name: record.get(name, default) for name, default in OUTBOX_DEFAULTS.items()}
    row["outbox_bytes_sent_by_class"] = json.dumps(
        dict(row["outbox_bytes_sent_by_class"]), sort_keys=True
    )
    return row


def outbox_by_vehicle(accepted: pd.DataFrame) -> pd.DataFrame:
    """Per car, its latest outbox snapshot in the batch (every record carries one)."""
    columns = ["vehicle_pseudonym", *OUTBOX_DEFAULTS]
    if accepted.empty or "outbox_backlog_logs" not in accepted:
        return pd.DataFrame(columns=columns)
    latest = accepted.sort_values("recorded_at").groupby("vehicle_pseudonym").tail(1)
    return latest[columns].sort_values("vehicle_pseudonym").reset_index(drop=True)
