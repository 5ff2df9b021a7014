"""Carrying out an approved retention plan: exactly its delete rows, each re-checked first.

A plan can go stale between the moment it was computed (and reviewed) and the moment it is
carried out: a dataset published in between may now name a branch's commits, a car may have
uploaded more logs to the branch. So right before deleting, the lineage is read again and
every delete row is judged again against the lake as it is now; a row that would no longer be
deleted, or whose branch head moved, is skipped with the reason, never deleted.

Only ``ingest-<batch>`` branches are ever touched: a branch is deleted (its commits stay
addressable by id until the lake's garbage collection reclaims them), and a quarantined upload
is removed from its branch by one commit per branch (``commit_changes``), marked as
retention's so it does not make the branch look freshly uploaded. ``main`` is never written
here, so its history cannot change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import commit_changes

from .retention import (
    DELETE,
    RETENTION_COMMIT_KIND,
    Candidate,
    PlanRow,
    branch_candidates,
    quarantined_candidates,
    verdict,
)
from .retention_lineage import RawLineage, read_raw_lineage
from .retention_settings import INGEST_BRANCH, RetentionSettings


@dataclass
class RetentionOutcome:
    """What an approved run removed, and what it skipped with why."""

    deleted: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_record(self) -> dict[str, object]:
        return {"deleted": self.deleted, "skipped": self.skipped}


def ensure_ingest_branch(name: str) -> str:
    """Refuse any branch retention must never touch (``main``, run branches, anything else)."""
    if name == MAIN_BRANCH or not name.startswith(INGEST_BRANCH_PREFIX):
        raise ValueError(
            f"retention only ever deletes on {INGEST_BRANCH_PREFIX}* branches, not {name!r}"
        )
    return name


def _recheck(
    row: PlanRow,
    current: Candidate | None,
    lineage_now: RawLineage,
    settings: RetentionSettings,
    now: datetime,
) -> str | None:
    """Why ``row`` must not be carried out any more, or ``None`` when it still stands."""
    if current is None:
        return "already gone"
    if current.ref != row.ref:
        return f"moved since the plan ({row.ref[:12]} → {current.ref[:12]})"
    action, reason, _ = verdict(current, lineage_now, settings, now)
    return None if action == DELETE else f"kept on re-check: {reason}"


def _current_candidates(lake: VersionedLake, rows: Iterable[PlanRow]) -> dict[tuple, Candidate]:
    kinds = {row.kind for row in rows}
    found = branch_candidates(lake) if INGEST_BRANCH in kinds else []
    found += quarantined_candidates(lake) if kinds - {INGEST_BRANCH} else []
    return {(candidate.kind, candidate.name): candidate for candidate in found}


def apply_deletions(
    lake: VersionedLake,
    rows: list[PlanRow],
    *,
    approved_by: str,
    plan_digest: str,
    now: datetime,
    settings: RetentionSettings,
) -> RetentionOutcome:
    """Delete the plan's ``rows`` (its delete rows) that still stand after a fresh re-check."""
    outcome = RetentionOutcome()
    rows = [row for row in rows if row.action == DELETE]
    if not rows:
        return outcome
    lineage_now = read_raw_lineage(lake)  # right before deleting: the plan may be stale
    current = _current_candidates(lake, rows)
    uploads: dict[str, list[PlanRow]] = {}
    for row in rows:
        ensure_ingest_branch(row.branch)
        why_not = _recheck(row, current.get((row.kind, row.name)), lineage_now, settings, now)
        if why_not is not None:
            outcome.skipped.append({"kind": row.kind, "name": row.name, "reason": why_not})
        elif row.kind == INGEST_BRANCH:
            lake.delete_branch(row.branch)
            outcome.deleted.append({"kind": row.kind, "name": row.name})
        else:
            uploads.setdefault(row.branch, []).append(row)
    metadata = {
        "kind": RETENTION_COMMIT_KIND,
        "approved_by": approved_by,
        "plan_digest": plan_digest,
    }
    for branch, removed in sorted(uploads.items()):
        commit_changes(
            lake,
            branch,
            f"retention: remove {len(removed)} expired quarantined upload(s)",
            metadata,
            deletes=[row.key for row in removed],
        )
        outcome.deleted += [{"kind": row.kind, "name": row.name} for row in removed]
    return outcome
