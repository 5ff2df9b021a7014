"""What the ingest sensor does on a tick, as a plain function.

The cursor maps each ingest branch to the last head commit already turned into run requests.
A tick lists branches (cheap: one call) and, only for branches whose head moved, diffs the old
head against the new one — so its cost grows with the new commits, not with the history. A
branch seen for the first time is diffed three-dot against ``main``: exactly what was uploaded
since it forked. Run keys hash branch, key and content, so a repeated tick, a lost cursor or a
daemon restart can never launch a duplicate run for the same upload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from aiinfra_pipelines.lake.errors import InvalidKeyError
from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, LOG_PREFIX
from aiinfra_pipelines.lake.port import DiffEntry, VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH

from .partitions import LogLocation, is_drive_log_key


@dataclass(frozen=True)
class LandedLog:
    """A drive log object that appeared (or changed) on an ingest branch."""

    location: LogLocation
    commit: str
    checksum: str
    size: int

    @property
    def partition_key(self) -> str:
        return self.location.partition_key

    @property
    def run_key(self) -> str:
        return f"{self.location.partition_key}@{self.checksum}"


def parse_cursor(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    parsed = json.loads(raw)
    if not isinstance(parsed, dict):
        raise ValueError(f"ingest sensor cursor must be a JSON object, got {raw!r}")
    return {str(branch): str(commit) for branch, commit in parsed.items()}


def dump_cursor(cursor: dict[str, str]) -> str:
    return json.dumps(cursor, sort_keys=True)


@dataclass(frozen=True)
class MovedBranch:
    """An ingest branch whose head moved since the cursor, with what changed under a prefix."""

    name: str
    head: str
    changes: list[DiffEntry]


def moved_ingest_branches(
    lake: VersionedLake, cursor: Mapping[str, str], prefix: str
) -> tuple[list[MovedBranch], dict[str, str]]:
    """Ingest branches whose head moved since ``cursor`` (branch → head seen), each with its
    changes under ``prefix``, and the cursor after them.

    Every uploader (drive logs, telemetry) lands on ``ingest-<batch>`` branches and every
    discovery must scan them the same way, so the cost stays proportional to new commits: an
    unmoved branch is skipped without a diff, a moved one is diffed from the head last seen, and
    one seen for the first time is diffed three-dot against ``main`` (what it added since it
    forked). The returned cursor lists every ingest branch, moved or not.
    """
    lake.ensure_repository()
    moved: list[MovedBranch] = []
    next_cursor: dict[str, str] = {}
    for branch in lake.list_branches(prefix=INGEST_BRANCH_PREFIX):
        next_cursor[branch.name] = branch.head
        previous = cursor.get(branch.name)
        if previous == branch.head:
            continue
        if previous:
            changes = lake.diff(previous, branch.head, prefix=prefix)
        else:
            changes = lake.diff(MAIN_BRANCH, branch.head, prefix=prefix, three_dot=True)
        moved.append(MovedBranch(name=branch.name, head=branch.head, changes=changes))
    return moved, next_cursor


def discover_new_logs(
    lake: VersionedLake, cursor: dict[str, str], skipped: list[str] | None = None
) -> tuple[list[LandedLog], dict[str, str]]:
    """New drive logs on all ingest branches since ``cursor``, and the cursor after them.

    Objects whose keys the lake cannot address are appended to ``skipped`` (with the reason).
    """
    skipped = [] if skipped is None else skipped
    landed: list[LandedLog] = []
    moved, next_cursor = moved_ingest_branches(lake, cursor, LOG_PREFIX)
    for branch in moved:
        for change in branch.changes:
            if change.type == "removed" or not is_drive_log_key(change.key):
                continue
            try:
                stat = lake.stat_object(branch.head, change.key)
            except InvalidKeyError as error:
                # One oddly named upload must not stall every branch: skip it, loudly.
                skipped.append(f"{branch.name}/{change.key}: {error}")
                continue
            landed.append(
                LandedLog(
                    location=LogLocation(branch=branch.name, key=change.key),
                    commit=branch.head,
                    checksum=stat.checksum,
                    size=stat.size,
                )
            )
    return landed, next_cursor
