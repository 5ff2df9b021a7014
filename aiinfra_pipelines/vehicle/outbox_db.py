"""The outbox's SQLite database and cache folder: one place that opens a transaction, records
an event and says where a queued item's bytes are.

Every step of the outbox (queueing, each acknowledged part, eviction, a served pull) is one
transaction here, committed before the next step begins, so a power cut loses nothing but the
step in flight.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from .outbox_store import SCHEMA


class OutboxDatabase:
    """``outbox.sqlite3`` and ``data/`` in ``folder``; ``clock`` stamps events and transfers."""

    def __init__(self, folder: Path, clock: Callable[[], datetime]) -> None:
        self.folder = Path(folder)
        self.clock = clock
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        with self.connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(self.folder / "outbox.sqlite3", timeout=30)
        connection.row_factory = sqlite3.Row
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            with connection:  # one transaction: committed on success, rolled back otherwise
                yield connection
        finally:
            connection.close()

    def data_path(self, log_id: str) -> Path:
        return self.folder / "data" / f"{log_id}.bin"

    def event(self, db: sqlite3.Connection, kind: str, log_id: str, **detail: object) -> None:
        db.execute(
            "INSERT INTO events (at, kind, log_id, detail) VALUES (?, ?, ?, ?)",
            (self.clock().isoformat(), kind, log_id, json.dumps(detail, sort_keys=True)),
        )

    def sent_today(self, db: sqlite3.Connection) -> int:
        """Bytes sent on the clock's current day (what the daily budget is measured against)."""
        day = self.clock().date().isoformat()
        return db.execute(
            "SELECT COALESCE(SUM(bytes), 0) FROM transfers WHERE day = ?", (day,)
        ).fetchone()[0]
