"""The SQLite half of ``LocalLake``: its schema and the two kinds of transaction it runs.

A fresh connection per operation (no connection state on the resource, so it pickles and is
safe across threads and Dagster's step subprocesses). Every head move runs in a
``BEGIN IMMEDIATE`` transaction, so the reads that decide it cannot go stale before it commits;
WAL mode lets readers proceed meanwhile.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiinfra_pipelines.lake.errors import ConcurrentUpdateError

DB_FILENAME = "lake.sqlite3"
_BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS repositories (
    name TEXT PRIMARY KEY,
    default_branch TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS commits (
    repo TEXT NOT NULL,
    id TEXT NOT NULL,
    parents TEXT NOT NULL,          -- JSON list of commit ids, first parent first
    first_parent TEXT,              -- parents[0], denormalised for the recursive chain walk
    message TEXT NOT NULL,
    metadata TEXT NOT NULL,         -- JSON object str -> str
    created_at TEXT NOT NULL,       -- ISO 8601, UTC, microseconds
    generation INTEGER NOT NULL,    -- 1 + max(parent generations); orders log and merge-base
    tree_digest TEXT NOT NULL,
    PRIMARY KEY (repo, id)
);
CREATE TABLE IF NOT EXISTS trees (
    repo TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    key TEXT NOT NULL,
    sha TEXT NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (repo, commit_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    repo TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    key TEXT NOT NULL,
    type TEXT NOT NULL,             -- added | removed | changed, against the first parent
    sha TEXT,                       -- content after the commit (NULL when removed)
    size INTEGER,
    PRIMARY KEY (repo, commit_id, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS branches (
    repo TEXT NOT NULL,
    name TEXT NOT NULL,
    head TEXT NOT NULL,
    PRIMARY KEY (repo, name)
);
CREATE TABLE IF NOT EXISTS staging (
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    key TEXT NOT NULL,
    sha TEXT,                       -- NULL: staged delete (tombstone)
    size INTEGER,
    PRIMARY KEY (repo, branch, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tags (
    repo TEXT NOT NULL,
    name TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    PRIMARY KEY (repo, name)
);
"""

# Bumped when the schema changes; stored in ``PRAGMA user_version`` so a connection can tell in
# one cheap query whether the file (possibly just created, or re-created) needs the schema.
_SCHEMA_VERSION = 1


@contextmanager
def connect(root: Path) -> Iterator[sqlite3.Connection]:
    """A connection to the lake database under ``root`` (created, with its schema, on first
    use); autocommit mode, so the callers below own the transactions."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / DB_FILENAME
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = FULL")
        _init_schema(conn)
        yield conn
    finally:
        conn.close()


def _init_schema(conn: sqlite3.Connection) -> None:
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version >= _SCHEMA_VERSION:
        return
    conn.execute("PRAGMA journal_mode = WAL")  # persistent: set once per database file
    conn.executescript(_SCHEMA + f"PRAGMA user_version = {_SCHEMA_VERSION};")


@contextmanager
def read_transaction(root: Path) -> Iterator[sqlite3.Connection]:
    """A read transaction: one consistent snapshot for every statement inside."""
    with connect(root) as conn:
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")  # read-only: COMMIT just releases the snapshot


@contextmanager
def write_transaction(root: Path) -> Iterator[sqlite3.Connection]:
    """A ``BEGIN IMMEDIATE`` transaction: takes the write lock up front, so the reads that
    decide a head move cannot be invalidated by another writer before we commit."""
    with connect(root) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise ConcurrentUpdateError(
                f"lake database {root / DB_FILENAME} stayed locked for "
                f"{_BUSY_TIMEOUT_MS / 1000:.0f}s: {exc}"
            ) from exc
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")
