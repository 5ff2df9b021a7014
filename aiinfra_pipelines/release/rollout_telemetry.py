"""Reading published telemetry off ``main`` for the rollout: which publishes are new, and
the records they added since a stage began.

The operations layer publishes one telemetry batch per merge into ``main`` (commit metadata
``kind: telemetry``); a stage is judged only on what was published after it started, and each
decision names the telemetry commit it used, so these readers define "fresh telemetry".
Publishes are judged one at a time, oldest first (:func:`next_telemetry_commit`): a rollout's
decisions are a function of the sequence of batches, never of how often the daemon ticked
between them (two batches seen in one tick are still two decisions).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

# The commit metadata kind of telemetry publishes. Defined here, by the consumer, because the
# operations layer comes after release and imports it from here.
TELEMETRY_COMMIT_KIND = "telemetry"


@dataclass(frozen=True)
class TelemetryPublish:
    """One merge into main that published (or re-published) a telemetry batch."""

    commit: str
    batch_id: str
    records_key: str


def telemetry_history_scan() -> int:
    return settings_section("operations.yaml", "telemetry").int("history_scan_commits")


def telemetry_publishes(
    lake: VersionedLake,
    since_commit: str | None = None,
    limit: int | None = None,
    until_commit: str | None = None,
) -> list[TelemetryPublish]:
    """Telemetry publishes on main newer than ``since_commit``, newest first (merges only),
    up to and including ``until_commit`` (main's head when ``None``).

    ``since_commit`` is itself a telemetry publish (a merge on main's first-parent line), so
    the log walk stops exactly there. The walk covers at most the configured number of commits.
    """
    found: list[TelemetryPublish] = []
    head = until_commit or MAIN_BRANCH
    for commit in lake.log(head, limit=telemetry_history_scan(), stop_at=since_commit):
        if len(commit.parents) != 2 or commit.metadata.get("kind") != TELEMETRY_COMMIT_KIND:
            continue
        found.append(
            TelemetryPublish(
                commit=commit.id,
                batch_id=commit.metadata.get("batch_id", ""),
                records_key=commit.metadata.get("records_key", ""),
            )
        )
        if limit is not None and len(found) >= limit:
            break
    return found


def latest_telemetry_commit(lake: VersionedLake) -> str | None:
    """The newest telemetry publish on main: the identity of "the telemetry we have now"."""
    publishes = telemetry_publishes(lake, limit=1)
    return publishes[0].commit if publishes else None


def next_telemetry_commit(lake: VersionedLake, after: str | None) -> str | None:
    """The telemetry publish a rollout judges next: the oldest one after ``after`` (the one it
    judged last), or ``after`` itself when nothing newer was published."""
    publishes = telemetry_publishes(lake, since_commit=after)
    return publishes[-1].commit if publishes else after


def _read_parquet(lake: VersionedLake, ref: str, key: str) -> pd.DataFrame:
    return lake.get_parquet(ref, key)


def telemetry_since(
    lake: VersionedLake, since_commit: str | None, until_commit: str | None = None
) -> pd.DataFrame:
    """Telemetry records published after ``since_commit`` (all of it when ``None``), up to and
    including the publish ``until_commit`` (every publish on main when ``None``).

    A batch re-published inside the window counts once (its newest publish), minus the records
    it already held at ``since_commit``: only telemetry new to the window counts.
    """
    tables = []
    seen_batches: set[str] = set()
    for publish in telemetry_publishes(lake, since_commit, until_commit=until_commit):
        if publish.records_key in seen_batches or not publish.records_key:
            continue
        seen_batches.add(publish.records_key)
        if not lake.object_exists(publish.commit, publish.records_key):
            continue
        table = _read_parquet(lake, publish.commit, publish.records_key)
        if since_commit and lake.object_exists(since_commit, publish.records_key):
            before = _read_parquet(lake, since_commit, publish.records_key)
            table = table[~table["record_id"].isin(set(before["record_id"]))]
        tables.append(table)
    if not tables:
        return pd.DataFrame()
    return pd.concat(tables, ignore_index=True).drop_duplicates("record_id", keep="first")
