"""What the ingest sensor does on a tick, as a plain function.

The cursor maps each ingest branch to the last head commit already turned into run requests.
A tick lists branches (cheap: one call) and, only for branches whose head moved, walks the
commits since the old head — so its cost grows with the new commits, not with the history. A
branch seen for the first time is walked back until every log it added since it forked from
``main`` is accounted for. Each commit that adds drive logs is one batch (one partition, one
run); the run key is the partition key, and commit ids name content, so a repeated tick, a lost
cursor or a daemon restart can never launch a duplicate run for the same upload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from aiinfra_pipelines.lake.errors import InvalidKeyError, NotFoundError
from aiinfra_pipelines.lake.keys import validate_key
from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, LOG_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import CommitInfo, DiffEntry, VersionedLake

from .partitions import BatchRef, is_drive_log_key


@dataclass(frozen=True)
class LandedBatch:
    """An upload batch found on an ingest branch: the commit and the drive logs it added."""

    ref: BatchRef
    keys: list[str]

    @property
    def partition_key(self) -> str:
        return self.ref.partition_key

    @property
    def run_key(self) -> str:
        return self.ref.partition_key


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


def _changed_log_keys(lake: VersionedLake, commit: CommitInfo) -> list[str]:
    """Drive-log keys ``commit`` added or changed against its first parent, as stored, sorted."""
    if commit.parents:
        changes = lake.diff(commit.parents[0], commit.id, prefix=LOG_PREFIX)
        candidates = [c.key for c in changes if c.type != "removed"]
    else:  # a root commit: everything it holds
        candidates = [stat.key for stat in lake.list_objects(commit.id, prefix=LOG_PREFIX)]
    return sorted(k for k in candidates if is_drive_log_key(k))


def commit_log_keys(
    lake: VersionedLake, commit: CommitInfo, skipped: list[str] | None = None
) -> list[str]:
    """The drive-log keys ``commit`` added or changed against its first parent, sorted.

    Keys the lake cannot address are left out and described in ``skipped``.
    """
    keys = []
    for key in _changed_log_keys(lake, commit):
        try:
            validate_key(key)
        except InvalidKeyError as error:
            if skipped is not None:
                skipped.append(f"{key}: {error}")
            continue
        keys.append(key)
    return keys


def batch_log_keys(lake: VersionedLake, batch: BatchRef) -> list[str]:
    """The drive logs of one batch, from its partition key alone (what its run ingests)."""
    commits = lake.log(batch.commit, limit=1)
    if not commits:
        raise NotFoundError(f"batch commit {batch.commit!r} not found on {batch.branch!r}")
    return commit_log_keys(lake, commits[0])


def _new_commits(
    lake: VersionedLake, branch: MovedBranch, previous: str | None
) -> list[CommitInfo]:
    """Commits on ``branch`` since ``previous`` (its head last seen), oldest first.

    A branch seen for the first time is walked back from its head until every log it added
    since forking from ``main`` (its three-dot diff) is covered: the commits of ``main`` it
    started from are never taken for uploads.
    """
    if previous:
        return list(reversed(lake.log(branch.head, stop_at=previous)))
    wanted = {c.key for c in branch.changes if c.type != "removed" and is_drive_log_key(c.key)}
    commits: list[CommitInfo] = []
    for commit in lake.log(branch.head):
        if not wanted:
            break
        commits.append(commit)
        # Every landed key counts, addressable or not: an odd key must not make the walk run
        # on through main's whole history.
        wanted -= set(_changed_log_keys(lake, commit))
    return list(reversed(commits))


def discover_new_batches(
    lake: VersionedLake, cursor: dict[str, str], skipped: list[str] | None = None
) -> tuple[list[LandedBatch], dict[str, str]]:
    """New upload batches on all ingest branches since ``cursor``, and the cursor after them.

    Keys the lake cannot address are left out of their batch and appended to ``skipped`` (with
    the reason): one oddly named upload must not stall every branch.
    """
    skipped = [] if skipped is None else skipped
    batches: list[LandedBatch] = []
    moved, next_cursor = moved_ingest_branches(lake, cursor, LOG_PREFIX)
    for branch in moved:
        if not branch.changes:
            continue
        for commit in _new_commits(lake, branch, cursor.get(branch.name)):
            problems: list[str] = []
            keys = commit_log_keys(lake, commit, problems)
            skipped += [f"{branch.name}/{problem}" for problem in problems]
            if keys:
                batches.append(LandedBatch(BatchRef(branch.name, commit.id), keys))
    return batches, next_cursor
