"""The outbox's vocabulary: item kinds and states, its SQLite schema, and what a drain or an
answer to pulls reports. Kept apart from the queue logic (``vehicle.outbox``) so that readers
of an outbox's state (telemetry, the fleet uploader) need not know how it uploads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiinfra_pipelines.lake.layout import (
    INDEX_RECORD_SUFFIX,
    LOG_PREFIX,
    LOG_SUFFIX,
    PULL_NOTICE_SUFFIX,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .outbox_settings import PriorityClass

QUEUED, UPLOADING, UPLOADED, EVICTED = "queued", "uploading", "uploaded", "evicted"
# A raw log whose index record went up instead: cached until a pull or an eviction.
HELD = "held"
Progress = Callable[[str, str, int], None]
OPEN_STATES = (QUEUED, UPLOADING)
CACHED_STATES = (QUEUED, UPLOADING, HELD)
# What an outbox item is: a raw log, the index record of a held log, or the notice that a
# pulled log can no longer be sent. Each lands under its own suffix (lake.layout).
LOG, INDEX, NOTICE = "log", "index", "notice"
ITEM_SUFFIXES = {LOG: LOG_SUFFIX, INDEX: INDEX_RECORD_SUFFIX, NOTICE: PULL_NOTICE_SUFFIX}

SCHEMA = """
CREATE TABLE IF NOT EXISTS logs (
    log_id TEXT PRIMARY KEY,  -- the item's id: the log id, or "<log id>.index" / ".unservable"
    kind TEXT NOT NULL,
    segment TEXT NOT NULL,    -- the log the item is about
    object_key TEXT NOT NULL, -- where it lands on the batch branch
    class TEXT NOT NULL,
    rank INTEGER NOT NULL,
    rules TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    seq INTEGER NOT NULL,
    enqueued_at TEXT NOT NULL,
    state TEXT NOT NULL,
    branch TEXT,
    key TEXT,
    upload_id TEXT,
    finished_at TEXT
);
CREATE TABLE IF NOT EXISTS parts (
    log_id TEXT NOT NULL,
    part_number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    PRIMARY KEY (log_id, part_number)
);
CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    log_id TEXT NOT NULL,
    part_number INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    day TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    log_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""


@dataclass
class DrainReport:
    """What one drain did: logs completed (in order), parts sent, and why it stopped."""

    uploaded: list[str] = field(default_factory=list)
    parts_sent: int = 0
    bytes_sent: int = 0
    stopped_by: str = "queue empty"
    commits: dict[str, str] = field(default_factory=dict)  # branch → commit id
    branches: list[str] = field(default_factory=list)  # where this drain staged uploads


def commit_uploads(lake: VersionedLake, branch: str, metadata: dict[str, str]) -> str | None:
    """Commit what outboxes completed on ``branch`` (and any a crashed drain left staged).

    Several cars' drains can stage on one batch branch and commit once: one commit is one
    ingest batch, so a fleet's upload is ingested in one run.
    """
    staged = [entry for entry in lake.uncommitted(branch) if entry.key.startswith(LOG_PREFIX)]
    if not staged:
        return None
    total = sum(entry.size or 0 for entry in staged)
    kinds = {
        kind: sum(entry.key.endswith(suffix) for entry in staged)
        for kind, suffix in ITEM_SUFFIXES.items()
    }
    batch = metadata.get("batch_id")
    return lake.commit(
        branch,
        f"{f'upload batch {batch}' if batch else 'outbox upload'}: {kinds[LOG]} log(s), "
        f"{kinds[INDEX]} index record(s), {kinds[NOTICE]} pull notice(s)",
        {
            "kind": "ingest-upload",
            "log_count": str(kinds[LOG]),
            "index_records": str(kinds[INDEX]),
            "pull_notices": str(kinds[NOTICE]),
            "total_bytes": str(total),
            **metadata,
        },
    )


@dataclass(frozen=True)
class QueueItem:
    """One thing to queue: a log, an index record or a notice, with its bytes and class."""

    item_id: str
    kind: str
    segment: str
    data: bytes
    rules: Sequence[str]
    priority: PriorityClass
    state: str

    @property
    def object_key(self) -> str:
        """Where the item lands on a batch branch (``lake.layout``)."""
        return f"{LOG_PREFIX}{self.segment}{ITEM_SUFFIXES[self.kind]}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class PullReport:
    """What one answer to the pull requests did: logs queued again, logs gone (evicted)."""

    served: list[str] = field(default_factory=list)
    unservable: list[str] = field(default_factory=list)
