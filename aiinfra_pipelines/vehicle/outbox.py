"""The car's persistent outbox: logs wait here, by priority, until they are safely in the lake.

A car's network is cellular, metered and unreliable, and its power can be cut at any moment.
So every log the trigger filter keeps is written to the car's cache and queued in SQLite
before anything is sent, and every step of its upload is recorded before the next one:

* **Order**: most urgent class first (``vehicle.yaml`` ``outbox.classes``: near-collisions
  before event triggers before condition samples), oldest first within a class.
* **Budget and window**: non-urgent classes stop when the day's byte budget would be exceeded;
  classes that need the upload window (parked on Wi-Fi) wait for it.
* **Resumable**: a log goes up in parts (``VersionedLake.begin_upload`` & co., S3 multipart
  semantics on lakeFS's gateway). The upload handle is stored before the first part and each
  acknowledged part right after it; a restarted outbox asks the lake what arrived and sends
  only the rest. A log whose upload completed just before a crash is recognised on the branch.
  Nothing is lost and no part is sent twice, except the one in flight at the crash.
  (:mod:`.outbox_transfer`; the database and cache folder: :mod:`.outbox_db`.)
* **Cache cap**: past ``cache_cap_bytes`` queued, logs are evicted, lowest class first and
  oldest first; urgent logs never. Every eviction is an event, reported with the rest.

The outbox never commits half a batch: after a drain, what it completed on a branch is
committed there in one commit (an ingest branch, as ``fleet.landing`` lands a batch).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from aiinfra_pipelines.durable import write_durably
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .outbox_db import OutboxDatabase
from .outbox_settings import OutboxSettings
from .outbox_store import (
    CACHED_STATES,
    EVICTED,
    HELD,
    INDEX,
    LOG,
    NOTICE,
    OPEN_STATES,
    QUEUED,
    UPLOADED,
    UPLOADING,
    DrainReport,
    Progress,
    PullReport,
    QueueItem,
    commit_uploads,
)
from .outbox_transfer import LogTransfer

__all__ = [
    "EVICTED",
    "HELD",
    "QUEUED",
    "UPLOADED",
    "UPLOADING",
    "DrainReport",
    "Outbox",
    "PullReport",
    "commit_uploads",
]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Outbox:
    """One car's outbox in ``folder`` (``outbox.sqlite3`` plus the cached log files)."""

    def __init__(
        self,
        folder: Path,
        settings: OutboxSettings | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.folder = Path(folder)
        self.settings = settings or OutboxSettings.load()
        self.clock = clock
        self.store = OutboxDatabase(self.folder, clock)
        self.transfer = LogTransfer(self.store, self.settings)

    # ------------------------------------------------------------------------- enqueue
    def enqueue(self, log_id: str, data: bytes, rules: Sequence[str]) -> str:
        """Cache ``data`` and queue it under the class of ``rules``; returns the class name.

        The file is durable before the row exists, so a queued log always has its bytes.
        Enqueuing the same log again is a no-op; other bytes under a known id are refused.
        """
        priority = self.settings.class_of(rules)
        self._insert([QueueItem(log_id, LOG, log_id, data, rules, priority, QUEUED)])
        return priority.name

    def hold(self, log_id: str, data: bytes, rules: Sequence[str], index_record: bytes) -> str:
        """Keep a low-value log in the cache and queue only its index record.

        The log waits, ``held``, for a pull (:meth:`serve_pulls`) or for eviction; its index
        record goes up in the index-record class (vehicle.yaml ``outbox.index_record_class``).
        Both rows are written in one transaction: a held log always has its index queued.
        Returns the held log's class.
        """
        priority = self.settings.class_of(rules)
        index_class = self.settings.class_named(self.settings.index_record_class)
        self._insert(
            [
                QueueItem(log_id, LOG, log_id, data, rules, priority, HELD),
                QueueItem(
                    f"{log_id}.{INDEX}", INDEX, log_id, index_record, rules, index_class, QUEUED
                ),
            ]
        )
        return priority.name

    def _insert(self, items: Sequence[QueueItem]) -> None:
        """Cache every item's bytes, then queue them all in one transaction.

        The files are durable before the rows exist, so a row always has its bytes; items the
        outbox already holds with the same bytes are skipped, other bytes are refused.
        """
        new: list[QueueItem] = []
        with self.store.connect() as db:
            for item in items:
                known = db.execute(
                    "SELECT sha256 FROM logs WHERE log_id = ?", (item.item_id,)
                ).fetchone()
                if known is None:
                    new.append(item)
                elif known["sha256"] != item.sha256:
                    raise ValueError(
                        f"log {item.item_id} is already in the outbox with other content"
                    )
        if not new:
            return
        for item in new:
            write_durably(self.store.data_path(item.item_id), item.data)
        with self.store.connect() as db:
            for item in new:
                seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM logs").fetchone()[0]
                db.execute(
                    "INSERT INTO logs (log_id, kind, segment, object_key, class, rank, rules, "
                    "size, sha256, seq, enqueued_at, state) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.item_id,
                        item.kind,
                        item.segment,
                        item.object_key,
                        item.priority.name,
                        item.priority.rank,
                        json.dumps(sorted(item.rules)),
                        len(item.data),
                        item.sha256,
                        seq,
                        self.clock().isoformat(),
                        item.state,
                    ),
                )
                self.store.event(
                    db,
                    "held" if item.state == HELD else "enqueued",
                    item.item_id,
                    priority=item.priority.name,
                    bytes=len(item.data),
                    item=item.kind,
                )
            evicted = self._evict_over_cap(db)
        # Files go only once the evictions are committed: a queued row always has its bytes.
        for evicted_id in evicted:
            self.store.data_path(evicted_id).unlink(missing_ok=True)

    def _evict_over_cap(self, db: sqlite3.Connection) -> list[str]:
        """Mark queued (not half-sent) logs of evictable classes evicted, lowest class and
        oldest first, until the cache is within its cap; returns their ids."""
        evicted: list[str] = []
        cached = db.execute(
            f"SELECT COALESCE(SUM(size), 0) FROM logs WHERE state IN {CACHED_STATES}"
        ).fetchone()[0]
        if cached <= self.settings.cache_cap_bytes:
            return evicted
        evictable = [p.name for p in self.settings.classes if p.evictable]
        # Held logs go first (their index is in the lake already), then queued ones.
        candidates = db.execute(
            "SELECT log_id, class, size, state FROM logs WHERE state IN (?, ?) AND kind = ? "
            "ORDER BY state = ? DESC, rank DESC, seq ASC",
            (HELD, QUEUED, LOG, HELD),
        ).fetchall()
        for row in candidates:
            if cached <= self.settings.cache_cap_bytes:
                break
            if row["class"] not in evictable and row["state"] != HELD:
                continue
            db.execute(
                "UPDATE logs SET state = ?, finished_at = ? WHERE log_id = ?",
                (EVICTED, self.clock().isoformat(), row["log_id"]),
            )
            self.store.event(
                db,
                "evicted",
                row["log_id"],
                priority=row["class"],
                bytes=row["size"],
                reason=f"cache over its cap of {self.settings.cache_cap_bytes} bytes",
                held=row["state"] == HELD,
            )
            evicted.append(row["log_id"])
            cached -= row["size"]
        return evicted

    # --------------------------------------------------------------------------- drain
    def drain(
        self,
        lake: VersionedLake,
        batch_branch: str,
        *,
        window_open: bool,
        on_progress: Progress | None = None,
        commit_metadata: dict[str, str] | None = None,
        commit: bool = True,
    ) -> DrainReport:
        """Upload what the order, the budget and the window allow; commit what completed.

        New uploads go to ``batch_branch`` (created from main if needed); a log whose upload
        began in an earlier drain finishes on the branch it began on.
        ``on_progress("part", log_id, n)`` runs after each acknowledged part and
        ``on_progress("completed", log_id, parts)`` once the lake joined them, before the
        outbox records it (progress display; tests crash the process there). With
        ``commit`` it also commits what a crashed earlier drain left staged
        (:meth:`upload_branches`); ``commit=False`` leaves all commits to the caller.
        """
        report = DrainReport()
        lake.create_branch(batch_branch, source_ref=MAIN_BRANCH, exist_ok=True)
        with self.store.connect() as db:
            rows = db.execute(
                f"SELECT * FROM logs WHERE state IN {OPEN_STATES} ORDER BY rank ASC, seq ASC"
            ).fetchall()
        touched: set[str] = set()
        for row in rows:
            priority = self.settings.class_named(row["class"])
            if priority.needs_window and not window_open:
                report.stopped_by = f"{priority.name} logs wait for the upload window"
                continue
            outcome = self.transfer.upload(
                lake, row, batch_branch, priority.ignores_budget, on_progress
            )
            report.parts_sent += outcome.parts_sent
            report.bytes_sent += outcome.bytes_sent
            if outcome.branch:
                touched.add(outcome.branch)
            if outcome.completed:
                report.uploaded.append(row["log_id"])
            elif outcome.stopped_by:
                report.stopped_by = outcome.stopped_by
                break
        report.branches = sorted(touched)
        if commit:
            # Also the branches earlier drains completed uploads on: a run that crashed after
            # an upload completed (its cached bytes deleted) but before its commit left it
            # staged there, and nothing else would commit it.
            recovered = set(self.upload_branches()) - touched
            for branch in sorted(touched | recovered):
                if branch in recovered and not lake.branch_exists(branch):
                    continue  # ingested and cleaned up since
                commit_id = commit_uploads(lake, branch, commit_metadata or {})
                if commit_id:
                    report.commits[branch] = commit_id
        return report

    # --------------------------------------------------------------------------- pulls
    def serve_pulls(self, requests: Mapping[str, Mapping[str, object]]) -> PullReport:
        """Answer the platform's open pull requests (``{log id: request}``) for logs here.

        A held log is queued again (its class decides when it goes: a bulk log waits for the
        window); a log this car evicted gets a notice queued instead, so the request can be
        closed with that reason. Requests for logs this car never had are not its to answer.
        Answering twice is a no-op.
        """
        report = PullReport()
        gone: list[str] = []
        with self.store.connect() as db:
            for log_id, request in sorted(requests.items()):
                row = db.execute(
                    "SELECT * FROM logs WHERE log_id = ? AND kind = ?", (log_id, LOG)
                ).fetchone()
                if row is None:
                    continue
                if row["state"] == HELD:
                    db.execute("UPDATE logs SET state = ? WHERE log_id = ?", (QUEUED, log_id))
                    self.store.event(db, "pull_served", log_id, request=request.get("request_id"))
                    report.served.append(log_id)
                elif row["state"] == EVICTED:
                    answered = db.execute(
                        "SELECT 1 FROM logs WHERE log_id = ?", (f"{log_id}.{NOTICE}",)
                    ).fetchone()
                    if answered is None:  # already answered: the notice is on its way
                        gone.append(log_id)
        index_class = self.settings.class_named(self.settings.index_record_class)
        for log_id in gone:
            evicted_at = self._evicted_at(log_id)
            notice = {
                "log_id": log_id,
                "request_id": requests[log_id].get("request_id"),
                "status": "unservable",
                "reason": f"evicted from the vehicle's cache at {evicted_at}",
                "evicted_at": evicted_at,
            }
            body = json.dumps(notice, sort_keys=True).encode()
            self._insert(
                [QueueItem(f"{log_id}.{NOTICE}", NOTICE, log_id, body, [], index_class, QUEUED)]
            )
            with self.store.connect() as db:
                self.store.event(db, "pull_unservable", log_id, reason=notice["reason"])
            report.unservable.append(log_id)
        return report

    def _evicted_at(self, log_id: str) -> str:
        with self.store.connect() as db:
            row = db.execute("SELECT finished_at FROM logs WHERE log_id = ?", (log_id,)).fetchone()
        return "" if row is None else str(row["finished_at"])

    # -------------------------------------------------------------------------- report
    def status(self) -> dict[str, object]:
        """Backlog and bytes sent per class, today's budget use, evictions (for telemetry)."""
        with self.store.connect() as db:
            backlog = {
                row["class"]: {"logs": row["logs"], "bytes": row["bytes"]}
                for row in db.execute(
                    "SELECT class, COUNT(*) AS logs, SUM(size) AS bytes FROM logs "
                    f"WHERE state IN {OPEN_STATES} AND kind = 'log' GROUP BY class"
                )
            }
            sent = {
                row["class"]: row["bytes"]
                for row in db.execute(
                    "SELECT logs.class AS class, SUM(transfers.bytes) AS bytes FROM transfers "
                    "JOIN logs USING (log_id) GROUP BY logs.class"
                )
            }
            evictions = [
                {"log_id": row["log_id"], "at": row["at"], **json.loads(row["detail"])}
                for row in db.execute(
                    "SELECT * FROM events WHERE kind = 'evicted' ORDER BY id"
                ).fetchall()
            ]
            sent_today = self.store.sent_today(db)
            held = db.execute(
                "SELECT COUNT(*) AS logs, COALESCE(SUM(size), 0) AS bytes FROM logs "
                "WHERE state = ?",
                (HELD,),
            ).fetchone()
            events = {
                row["kind"]: row["n"]
                for row in db.execute("SELECT kind, COUNT(*) AS n FROM events GROUP BY kind")
            }
        return {
            "backlog": backlog,
            "bytes_sent_by_class": sent,
            "sent_today_bytes": sent_today,
            "daily_budget_bytes": self.settings.daily_budget_bytes,
            "evictions": evictions,
            "held": {"logs": held["logs"], "bytes": held["bytes"]},
            "pulls_served": events.get("pull_served", 0),
            "pulls_unservable": events.get("pull_unservable", 0),
        }

    def upload_branches(self) -> list[str]:
        """Branches this outbox completed uploads on: where a crashed run may have left them
        staged and uncommitted (``drain(commit=True)`` and ``fleet_upload`` commit them)."""
        with self.store.connect() as db:
            return [
                row["branch"]
                for row in db.execute(
                    "SELECT DISTINCT branch FROM logs WHERE state = ? AND branch IS NOT NULL",
                    (UPLOADED,),
                )
            ]

    def states(self) -> dict[str, str]:
        with self.store.connect() as db:
            return {
                row["log_id"]: row["state"]
                for row in db.execute("SELECT log_id, state FROM logs ORDER BY seq")
            }

    def transfers(self) -> list[tuple[str, int]]:
        """(log id, part number) of every part sent, in order (what went over the air)."""
        with self.store.connect() as db:
            return [
                (row["log_id"], row["part_number"])
                for row in db.execute("SELECT log_id, part_number FROM transfers ORDER BY id")
            ]
