"""Landing drive logs on an ingest branch: one branch and one commit per upload batch.

This is the uploader's side of the contract. A real fleet's uploader does the same thing —
MCAP files under ``logs/`` on an ``ingest-<batch>`` branch, one commit with batch metadata —
and everything downstream is identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiinfra_pipelines.lake.keys import validate_branch_name
from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, LOG_PREFIX, LOG_SUFFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import commit_changes


@dataclass(frozen=True)
class LandedBatch:
    branch: str
    commit: str
    keys: list[str]
    total_bytes: int


def ingest_branch_name(batch_id: str) -> str:
    """The branch a batch lands on; a batch id the lake refuses as a branch name is an
    ``InvalidKeyError`` here, before anything is driven or uploaded."""
    return validate_branch_name(f"{INGEST_BRANCH_PREFIX}{batch_id}")


def land_batch(
    lake: VersionedLake,
    batch_id: str,
    logs: Sequence[tuple[str, bytes]],
    metadata: dict[str, str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> LandedBatch:
    """Upload ``(log_id, mcap_bytes)`` pairs to ``ingest-<batch_id>`` and commit them once."""
    if not logs:
        raise ValueError(f"batch {batch_id!r} has no logs to land")
    lake.ensure_repository()
    branch = ingest_branch_name(batch_id)
    lake.create_branch(branch, source_ref=MAIN_BRANCH, exist_ok=True)
    puts = [(f"{LOG_PREFIX}{log_id}{LOG_SUFFIX}", data) for log_id, data in logs]
    keys = [key for key, _ in puts]
    total = sum(len(data) for _, data in puts)
    commit = commit_changes(
        lake,
        branch,
        f"upload batch {batch_id}: {len(keys)} log(s)",
        {
            "kind": "ingest-upload",
            "batch_id": batch_id,
            "log_count": str(len(keys)),
            "total_bytes": str(total),
            **(metadata or {}),
        },
        puts=puts,
        allow_empty=False,
        on_put=(lambda done: on_progress(done, len(logs))) if on_progress else None,
    )
    return LandedBatch(branch=branch, commit=commit, keys=keys, total_bytes=total)
