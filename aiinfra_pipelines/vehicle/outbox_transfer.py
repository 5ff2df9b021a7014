"""Resumable upload of one queued log in parts (S3 multipart semantics through
``VersionedLake.begin_upload`` & co.).

The upload handle is stored before the first part and each acknowledged part right after it; a
restarted outbox asks the lake what arrived and sends only the rest, and a log whose upload
completed just before a crash is recognised on its branch. Apart from the queue
(:mod:`.outbox`) because this is the only part that talks to the lake.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from aiinfra_pipelines.lake.errors import NotFoundError
from aiinfra_pipelines.lake.port import UploadHandle, VersionedLake

from .outbox_db import OutboxDatabase
from .outbox_settings import OutboxSettings
from .outbox_store import UPLOADED, UPLOADING, Progress


class LogTransfer:
    """Sends queued logs to the lake part by part, recording every step in the outbox."""

    def __init__(self, store: OutboxDatabase, settings: OutboxSettings) -> None:
        self.store = store
        self.settings = settings

    def _handle(self, lake: VersionedLake, row: sqlite3.Row, branch: str) -> _Resumed:
        """The open upload for ``row`` with the parts the lake holds, or the finished object."""
        key = row["object_key"]
        if row["state"] == UPLOADING:
            handle = UploadHandle(row["branch"], row["key"], row["upload_id"])
            try:
                return _Resumed(handle, lake.uploaded_parts(handle), finished=False)
            except NotFoundError:
                on_branch = lake.object_exists(handle.branch, handle.key)
                if on_branch and lake.stat_object(handle.branch, handle.key).size == row["size"]:
                    return _Resumed(handle, {}, finished=True)  # completed before a crash
                branch = handle.branch  # the upload expired: start again where it began
        handle = lake.begin_upload(branch, key)
        with self.store.connect() as db:
            db.execute("DELETE FROM parts WHERE log_id = ?", (row["log_id"],))
            db.execute(
                "UPDATE logs SET state = ?, branch = ?, key = ?, upload_id = ? WHERE log_id = ?",
                (UPLOADING, handle.branch, handle.key, handle.upload_id, row["log_id"]),
            )
        return _Resumed(handle, {}, finished=False)

    def upload(
        self,
        lake: VersionedLake,
        row: sqlite3.Row,
        branch: str,
        ignores_budget: bool,
        on_progress: Progress | None,
    ) -> TransferOutcome:
        log_id = row["log_id"]
        resumed = self._handle(lake, row, branch)
        outcome = TransferOutcome(branch=resumed.handle.branch)
        if not resumed.finished:
            parts = self._send_parts(lake, log_id, resumed, ignores_budget, on_progress, outcome)
            if parts is None:
                return outcome  # stopped by the daily budget; the next drain resumes
            stat = lake.complete_upload(resumed.handle, parts)
            if on_progress is not None:
                on_progress("completed", log_id, len(parts))
            if stat.size != row["size"]:
                raise RuntimeError(
                    f"log {log_id}: the lake holds {stat.size} bytes after upload, not "
                    f"{row['size']}"
                )
        with self.store.connect() as db:
            db.execute(
                "UPDATE logs SET state = ?, finished_at = ? WHERE log_id = ?",
                (UPLOADED, self.store.clock().isoformat(), log_id),
            )
            self.store.event(
                db,
                "uploaded",
                log_id,
                branch=resumed.handle.branch,
                key=resumed.handle.key,
                recovered=resumed.finished,
            )
        self.store.data_path(log_id).unlink(missing_ok=True)
        outcome.completed = True
        return outcome

    def _send_parts(
        self,
        lake: VersionedLake,
        log_id: str,
        resumed: _Resumed,
        ignores_budget: bool,
        on_progress: Progress | None,
        outcome: TransferOutcome,
    ) -> dict[int, str] | None:
        """Every part the lake lacks, each recorded as sent; None when the budget stops it."""
        data = self.store.data_path(log_id).read_bytes()
        size = self.settings.part_bytes
        count = max(1, math.ceil(len(data) / size))
        with self.store.connect() as db:
            # The lake is the truth about what arrived: a part acknowledged but not yet
            # recorded when the car died went over the air, so it is recorded now, in the
            # parts and in the transfers the daily budget counts.
            recorded = {
                row["part_number"]
                for row in db.execute("SELECT part_number FROM parts WHERE log_id = ?", (log_id,))
            }
        for number, etag in sorted(resumed.parts.items()):
            if number not in recorded:
                chunk_bytes = len(data[(number - 1) * size : number * size])
                self._record_part(log_id, number, etag, chunk_bytes)
        parts = dict(resumed.parts)
        for number in range(1, count + 1):
            if number in parts:
                continue
            chunk = data[(number - 1) * size : number * size]
            with self.store.connect() as db:
                over = self.store.sent_today(db) + len(chunk) > self.settings.daily_budget_bytes
            if over and not ignores_budget:
                outcome.stopped_by = "daily budget reached"
                return None
            parts[number] = lake.upload_part(resumed.handle, number, chunk)
            self._record_part(log_id, number, parts[number], len(chunk))
            outcome.parts_sent += 1
            outcome.bytes_sent += len(chunk)
            if on_progress is not None:
                on_progress("part", log_id, number)
        return parts

    def _record_part(self, log_id: str, number: int, etag: str, size: int) -> None:
        with self.store.connect() as db:
            db.execute("INSERT OR REPLACE INTO parts VALUES (?, ?, ?)", (log_id, number, etag))
            now = self.store.clock()
            db.execute(
                "INSERT INTO transfers (log_id, part_number, bytes, day, at) "
                "VALUES (?, ?, ?, ?, ?)",
                (log_id, number, size, now.date().isoformat(), now.isoformat()),
            )


@dataclass
class _Resumed:
    """An upload as the lake knows it: its handle, the parts it holds, or already whole."""

    handle: UploadHandle
    parts: dict[int, str]
    finished: bool


@dataclass
class TransferOutcome:
    """What one drain step did for one log: where, whether it completed, why it stopped."""

    branch: str | None = None
    completed: bool = False
    stopped_by: str = ""
    parts_sent: int = 0
    bytes_sent: int = 0
