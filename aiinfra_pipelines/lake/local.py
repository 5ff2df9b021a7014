"""``LocalLake``: the embedded ``VersionedLake`` adapter (SQLite history, content-addressed files).

It gives a laptop or CI run the same branch/commit/merge semantics as a lakeFS server without
running one. Layout under ``root`` (default ``<DAGSTER_HOME>/lake``)::

    lake.sqlite3                 repositories, branches, commits, trees, changes, staging, tags
    objects/<sha[:2]>/<sha>      object content, named by its sha256 (stored once)

Design choices, and why:

* **Content addressing.** An object's name is the sha256 of its bytes, so identical content is
  stored once, a file is never modified after it is written, and reads can verify integrity.
  Files are written to a temp file in the same directory, fsynced and ``os.replace``-d into
  place, then the directory is fsynced: a crash leaves at worst a stray temp file, never a
  truncated object.
* **Per-commit trees plus per-commit deltas.** ``trees`` holds every commit's full key->content
  map (cheap reads at any commit); ``changes`` holds each commit's delta against its first
  parent. A diff between a commit and an ancestor on its first-parent line only reads the deltas
  of the commits in between, so a sensor that diffs "last seen" against ``main`` costs
  O(new commits), not O(history x tree size). Commits that are not first-parent relatives
  (e.g. two sibling branches) fall back to one SQL join of the two full trees.
* **Serialisable, crash-safe history.** Every commit, merge and branch-head move runs in a
  ``BEGIN IMMEDIATE`` transaction and moves the head with compare-and-swap
  (``UPDATE ... WHERE head = <expected>``), retried on conflict. Two processes committing to the
  same branch therefore serialise: each commit's parent is the other's, none is lost. WAL mode
  lets readers proceed while a writer commits.
* **No connection state on the resource.** A fresh SQLite connection is opened per operation, so
  the resource pickles, and is safe across threads and the subprocesses Dagster runs steps in.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.lake.errors import (
    BranchExistsError,
    ConcurrentUpdateError,
    LakeError,
    MergeConflictError,
    NotFoundError,
    NothingToCommitError,
    TagExistsError,
)
from aiinfra_pipelines.lake.keys import (
    validate_branch_name,
    validate_key,
    validate_prefix,
    validate_tag_name,
)
from aiinfra_pipelines.lake.local_uploads import LocalUploads
from aiinfra_pipelines.lake.port import (
    DEFAULT_BRANCH,
    BranchInfo,
    CommitInfo,
    DiffEntry,
    ObjectStat,
    UploadHandle,
    VersionedLake,
    check_metadata,
)

DB_FILENAME = "lake.sqlite3"
OBJECTS_DIRNAME = "objects"
INITIAL_COMMIT_MESSAGE = "Repository created"  # lakeFS's message for a repository's root commit

_BUSY_TIMEOUT_MS = 30_000
_CAS_RETRIES = 50
_SQL_CHUNK = 500  # bound on host parameters per IN (...) list
_HEX = re.compile(r"[0-9a-f]+")
_MIN_COMMIT_PREFIX = 6

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


class _Value(NamedTuple):
    """A key's content: sha256 of the bytes and their length."""

    sha: str
    size: int


# A key is either present with a _Value or absent (None).
_Slot = _Value | None
# A change to one key: (value before, value after).
_Change = tuple[_Slot, _Slot]


class _CommitRow(NamedTuple):
    id: str
    parents: list[str]
    message: str
    metadata: dict[str, str]
    created_at: str
    generation: int
    tree_digest: str

    def info(self) -> CommitInfo:
        return CommitInfo(
            id=self.id,
            parents=list(self.parents),
            message=self.message,
            metadata=dict(self.metadata),
            created_at=datetime.fromisoformat(self.created_at),
        )


class _HeadMoved(Exception):
    """Internal: the compare-and-swap on a branch head lost a race; retry the operation."""


def _same(a: _Slot, b: _Slot) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.sha == b.sha


def _entry(key: str, change: _Change) -> DiffEntry:
    old, new = change
    if old is None and new is not None:
        return DiffEntry(key=key, type="added", size=new.size)
    if new is None and old is not None:
        return DiffEntry(key=key, type="removed", size=old.size)
    assert new is not None
    return DiffEntry(key=key, type="changed", size=new.size)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _fsync_dir(path: Path) -> None:
    """Persist a directory entry (a rename or a new file); not supported everywhere."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _chunks(items: list[str], size: int = _SQL_CHUNK) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class LocalLake(VersionedLake):
    """Embedded ``VersionedLake``: SQLite for history, content-addressed files for data.

    ``root`` is the lake directory; empty means ``<DAGSTER_HOME>/lake``. Several repositories
    can share one root (they are keyed by ``repository``).
    """

    root: str = ""
    # S3 rejects a multipart upload whose non-final part is under 5 MiB; LocalLake enforces the
    # same so code that works here works on lakeFS. Tests may lower it to send small parts.
    upload_min_part_bytes: int = 5 * 1024 * 1024

    # ============================================================================ plumbing
    def root_path(self) -> Path:
        """The lake directory this instance uses (resolved at call time, so ``DAGSTER_HOME``
        set after construction is honoured)."""
        return Path(self.root) if self.root else dagster_home() / "lake"

    def _objects_dir(self) -> Path:
        return self.root_path() / OBJECTS_DIRNAME

    def _blob_path(self, sha: str) -> Path:
        return self._objects_dir() / sha[:2] / sha

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        root = self.root_path()
        root.mkdir(parents=True, exist_ok=True)
        path = root / DB_FILENAME
        conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = FULL")
            self._init_schema(conn)
            yield conn
        finally:
            conn.close()

    @staticmethod
    def _init_schema(conn: sqlite3.Connection) -> None:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version >= _SCHEMA_VERSION:
            return
        conn.execute("PRAGMA journal_mode = WAL")  # persistent: set once per database file
        conn.executescript(_SCHEMA + f"PRAGMA user_version = {_SCHEMA_VERSION};")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for every statement inside."""
        with self._connect() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")  # read-only: COMMIT just releases the snapshot

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: takes the write lock up front, so the reads that
        decide a head move cannot be invalidated by another writer before we commit."""
        with self._connect() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise ConcurrentUpdateError(
                    f"lake database {self.root_path() / DB_FILENAME} stayed locked for "
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

    # ------------------------------------------------------------------------ blob storage
    def _write_blob(self, data: bytes) -> _Value:
        sha = hashlib.sha256(data).hexdigest()
        path = self._blob_path(sha)
        try:
            if path.stat().st_size == len(data):
                # Already stored (content addressing dedups). Another process may have renamed
                # it into place without its directory fsync yet: make the entry durable first.
                _fsync_dir(path.parent)
                return _Value(sha, len(data))
        except FileNotFoundError:
            pass
        shard = path.parent
        if not shard.is_dir():
            shard.mkdir(parents=True, exist_ok=True)
            _fsync_dir(shard.parent)
        fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{sha[:12]}-", dir=shard)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        _fsync_dir(shard)
        return _Value(sha, len(data))

    def _read_blob(self, value: _Value, key: str) -> bytes:
        path = self._blob_path(value.sha)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise LakeError(
                f"content of {key!r} ({value.sha}) is missing from {path}: the store is damaged"
            ) from exc
        if hashlib.sha256(data).hexdigest() != value.sha:
            raise LakeError(f"content of {key!r} at {path} does not match its checksum {value.sha}")
        return data

    # ------------------------------------------------------------------------ lookups
    def _require_repo(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT 1 FROM repositories WHERE name = ?", (self.repository,))
        if row.fetchone() is None:
            raise NotFoundError(
                f"repository {self.repository!r} not found under {self.root_path()}; "
                "call ensure_repository() first"
            )

    def _branch_head_or_none(self, conn: sqlite3.Connection, name: str) -> str | None:
        row = conn.execute(
            "SELECT head FROM branches WHERE repo = ? AND name = ?", (self.repository, name)
        ).fetchone()
        return None if row is None else str(row[0])

    def _branch_head(self, conn: sqlite3.Connection, name: str) -> str:
        head = self._branch_head_or_none(conn, name)
        if head is None:
            raise NotFoundError(f"branch {name!r} not found in repository {self.repository!r}")
        return head

    def _resolve(self, conn: sqlite3.Connection, ref: str) -> str:
        """Branch name, then tag, then full or unique-prefix commit id -> commit id."""
        if not isinstance(ref, str) or not ref:
            raise NotFoundError(f"ref {ref!r} not found in repository {self.repository!r}")
        head = self._branch_head_or_none(conn, ref)
        if head is not None:
            return head
        row = conn.execute(
            "SELECT commit_id FROM tags WHERE repo = ? AND name = ?", (self.repository, ref)
        ).fetchone()
        if row is not None:
            return str(row[0])
        if _HEX.fullmatch(ref) and len(ref) >= _MIN_COMMIT_PREFIX:
            rows = conn.execute(
                "SELECT id FROM commits WHERE repo = ? AND id >= ? AND id < ? ORDER BY id LIMIT 2",
                (self.repository, ref, ref + "g"),
            ).fetchall()
            if len(rows) == 1:
                return str(rows[0][0])
            if len(rows) > 1:
                raise LakeError(f"commit id prefix {ref!r} is ambiguous; give more characters")
        raise NotFoundError(
            f"ref {ref!r} not found in repository {self.repository!r} "
            "(not a branch, tag or commit id)"
        )

    def _commit_row(self, conn: sqlite3.Connection, commit_id: str) -> _CommitRow:
        row = conn.execute(
            "SELECT id, parents, message, metadata, created_at, generation, tree_digest "
            "FROM commits WHERE repo = ? AND id = ?",
            (self.repository, commit_id),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"commit {commit_id!r} not found in repository {self.repository!r}")
        return _CommitRow(
            id=row[0],
            parents=json.loads(row[1]),
            message=row[2],
            metadata=json.loads(row[3]),
            created_at=row[4],
            generation=int(row[5]),
            tree_digest=row[6],
        )

    def _tree_value(self, conn: sqlite3.Connection, commit_id: str | None, key: str) -> _Slot:
        if commit_id is None:
            return None
        row = conn.execute(
            "SELECT sha, size FROM trees WHERE repo = ? AND commit_id = ? AND key = ?",
            (self.repository, commit_id, key),
        ).fetchone()
        return None if row is None else _Value(row[0], int(row[1]))

    def _lookup(self, conn: sqlite3.Connection, ref: str, key: str) -> _Slot:
        """The value of ``key`` at ``ref``; a branch ref sees its staged changes first."""
        head = self._branch_head_or_none(conn, ref)
        if head is None:
            return self._tree_value(conn, self._resolve(conn, ref), key)
        row = conn.execute(
            "SELECT sha, size FROM staging WHERE repo = ? AND branch = ? AND key = ?",
            (self.repository, ref, key),
        ).fetchone()
        if row is not None:
            return None if row[0] is None else _Value(row[0], int(row[1]))
        return self._tree_value(conn, head, key)

    def _staged_changes(
        self, conn: sqlite3.Connection, branch: str, head: str
    ) -> dict[str, _Change]:
        """Staged entries of ``branch`` that really differ from its HEAD tree."""
        rows = conn.execute(
            "SELECT s.key, s.sha, s.size, t.sha, t.size FROM staging s "
            "LEFT JOIN trees t ON t.repo = s.repo AND t.commit_id = ? AND t.key = s.key "
            "WHERE s.repo = ? AND s.branch = ? ORDER BY s.key",
            (head, self.repository, branch),
        )
        changes: dict[str, _Change] = {}
        for key, new_sha, new_size, old_sha, old_size in rows:
            old = None if old_sha is None else _Value(old_sha, int(old_size))
            new = None if new_sha is None else _Value(new_sha, int(new_size))
            if not _same(old, new):
                changes[key] = (old, new)
        return changes

    # ------------------------------------------------------------------------ commit creation
    def _tree_digest(
        self, conn: sqlite3.Connection, base: str | None, delta: dict[str, _Change]
    ) -> str:
        """sha256 over the sorted (key, sha) pairs of ``base``'s tree with ``delta`` applied.

        SQLite's BINARY collation orders UTF-8 bytes, which is the same order as Python's code
        point comparison, so the stream merge below sees one consistent ordering.
        """
        digest = hashlib.sha256()
        pending = sorted((key, change[1]) for key, change in delta.items())
        rows: Iterable[tuple[str, str]] = ()
        if base is not None:
            rows = conn.execute(
                "SELECT key, sha FROM trees WHERE repo = ? AND commit_id = ? ORDER BY key",
                (self.repository, base),
            )

        def feed(key: str, sha: str) -> None:
            digest.update(key.encode("utf-8") + b"\0" + sha.encode("ascii") + b"\n")

        index = 0
        for key, sha in rows:
            while index < len(pending) and pending[index][0] < key:
                new_key, new = pending[index]
                index += 1
                if new is not None:
                    feed(new_key, new.sha)
            if index < len(pending) and pending[index][0] == key:
                new = pending[index][1]
                index += 1
                if new is not None:
                    feed(key, new.sha)
                continue
            feed(key, sha)
        for new_key, new in pending[index:]:
            if new is not None:
                feed(new_key, new.sha)
        return digest.hexdigest()

    def _insert_commit(
        self,
        conn: sqlite3.Connection,
        parents: list[str],
        changes: dict[str, _Slot],
        message: str,
        metadata: dict[str, str],
    ) -> str:
        """Write a commit whose tree is ``parents[0]``'s tree with ``changes`` applied.

        Must run inside a write transaction. Records the full tree and the delta against the
        first parent (the delta is what makes ancestor diffs cheap).
        """
        repo = self.repository
        first = parents[0] if parents else None
        generation = 1 + max((self._commit_row(conn, p).generation for p in parents), default=0)
        delta: dict[str, _Change] = {}
        for key, new in changes.items():
            old = self._tree_value(conn, first, key)
            if not _same(old, new):
                delta[key] = (old, new)
        tree_digest = self._tree_digest(conn, first, delta)
        created_at = _now_iso()
        payload = json.dumps(
            {
                "parents": parents,
                "tree": tree_digest,
                "message": message,
                "metadata": metadata,
                "created_at": created_at,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        commit_id = hashlib.sha256(payload.encode("utf-8")).hexdigest()
        exists = conn.execute(
            "SELECT 1 FROM commits WHERE repo = ? AND id = ?", (repo, commit_id)
        ).fetchone()
        if exists is not None:
            return commit_id  # byte-identical commit (same parents, tree, text and instant)
        conn.execute(
            "INSERT INTO commits (repo, id, parents, first_parent, message, metadata, created_at, "
            "generation, tree_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                repo,
                commit_id,
                json.dumps(parents),
                first,
                message,
                json.dumps(metadata, sort_keys=True),
                created_at,
                generation,
                tree_digest,
            ),
        )
        if first is not None:
            conn.execute(
                "INSERT INTO trees (repo, commit_id, key, sha, size) "
                "SELECT repo, ?, key, sha, size FROM trees WHERE repo = ? AND commit_id = ?",
                (commit_id, repo, first),
            )
        removed = [(repo, commit_id, key) for key, (_, new) in delta.items() if new is None]
        upserts = [
            (repo, commit_id, key, new.sha, new.size)
            for key, (_, new) in delta.items()
            if new is not None
        ]
        conn.executemany("DELETE FROM trees WHERE repo = ? AND commit_id = ? AND key = ?", removed)
        conn.executemany(
            "INSERT OR REPLACE INTO trees (repo, commit_id, key, sha, size) VALUES (?, ?, ?, ?, ?)",
            upserts,
        )
        conn.executemany(
            "INSERT INTO changes (repo, commit_id, key, type, sha, size) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    repo,
                    commit_id,
                    key,
                    _entry(key, change).type,
                    None if change[1] is None else change[1].sha,
                    None if change[1] is None else change[1].size,
                )
                for key, change in delta.items()
            ],
        )
        return commit_id

    def _move_head(self, conn: sqlite3.Connection, branch: str, expected: str, new: str) -> None:
        """Compare-and-swap the branch head; raise ``_HeadMoved`` when another writer won."""
        cursor = conn.execute(
            "UPDATE branches SET head = ? WHERE repo = ? AND name = ? AND head = ?",
            (new, self.repository, branch, expected),
        )
        if cursor.rowcount != 1:
            raise _HeadMoved(branch)

    # ------------------------------------------------------------------------ graph walks
    def _merge_base(self, conn: sqlite3.Connection, a: str, b: str) -> str:
        """A best common ancestor of ``a`` and ``b`` (highest generation).

        Walks both histories in generation order, painting commits with the side(s) they are
        reachable from; since a parent's generation is below all its children's, a commit's
        paint is final when it is popped, and the first commit painted by both sides is a
        common ancestor that no other common ancestor descends from.
        """
        if a == b:
            return a
        rows: dict[str, _CommitRow] = {}
        paint: dict[str, int] = {a: 1, b: 2}
        heap: list[tuple[int, str]] = []
        for cid in (a, b):
            rows[cid] = self._commit_row(conn, cid)
            heapq.heappush(heap, (-rows[cid].generation, cid))
        while heap:
            _, cid = heapq.heappop(heap)
            side = paint[cid]
            if side == 3:
                return cid
            for parent in rows[cid].parents:
                if parent not in rows:
                    rows[parent] = self._commit_row(conn, parent)
                    paint[parent] = side
                    heapq.heappush(heap, (-rows[parent].generation, parent))
                else:
                    paint[parent] |= side
        raise LakeError(f"commits {a} and {b} share no history")

    def _first_parent_chain(
        self, conn: sqlite3.Connection, start: str, target: str, target_generation: int
    ) -> list[str] | None:
        """Commits from ``start`` down its first-parent line to ``target`` (exclusive), or
        ``None`` when ``target`` is not on that line. Generations strictly decrease along the
        line, so the walk stops at ``target``'s generation: O(commits in between)."""
        rows = conn.execute(
            """
            WITH RECURSIVE chain(id, first_parent, generation) AS (
                SELECT id, first_parent, generation FROM commits WHERE repo = :repo AND id = :start
                UNION ALL
                SELECT c.id, c.first_parent, c.generation
                FROM commits c JOIN chain ON c.repo = :repo AND c.id = chain.first_parent
                WHERE chain.id != :target AND chain.generation > :generation
            )
            SELECT id FROM chain
            """,
            {
                "repo": self.repository,
                "start": start,
                "target": target,
                "generation": target_generation,
            },
        ).fetchall()
        ids = [str(row[0]) for row in rows]
        if target not in ids:
            return None
        return [cid for cid in ids if cid != target]

    def _diff_commits(
        self, conn: sqlite3.Connection, left: str, right: str, prefix: str = ""
    ) -> dict[str, _Change]:
        """Key -> (left value, right value) for every key that differs between two commits."""
        if left == right:
            return {}
        left_row = self._commit_row(conn, left)
        right_row = self._commit_row(conn, right)
        if left_row.tree_digest == right_row.tree_digest:
            return {}
        chain: list[str] | None = None
        if left_row.generation < right_row.generation:
            chain = self._first_parent_chain(conn, right, left, left_row.generation)
        elif right_row.generation < left_row.generation:
            chain = self._first_parent_chain(conn, left, right, right_row.generation)
        if chain is not None:
            return self._diff_delta(conn, left, right, chain, prefix)
        return self._diff_full(conn, left, right, prefix)

    def _diff_delta(
        self, conn: sqlite3.Connection, left: str, right: str, chain: list[str], prefix: str
    ) -> dict[str, _Change]:
        """Diff via the recorded deltas of the commits between two first-parent relatives:
        only keys some commit in ``chain`` touched can differ."""
        touched: set[str] = set()
        for chunk in _chunks(chain):
            marks = ",".join("?" * len(chunk))
            touched.update(
                str(row[0])
                for row in conn.execute(
                    f"SELECT DISTINCT key FROM changes WHERE repo = ? AND commit_id IN ({marks})",
                    (self.repository, *chunk),
                )
            )
        result: dict[str, _Change] = {}
        for key in sorted(touched):
            if prefix and not key.startswith(prefix):
                continue
            old = self._tree_value(conn, left, key)
            new = self._tree_value(conn, right, key)
            if not _same(old, new):
                result[key] = (old, new)
        return result

    def _diff_full(
        self, conn: sqlite3.Connection, left: str, right: str, prefix: str
    ) -> dict[str, _Change]:
        """Diff by joining the two full trees (used when the commits are not first-parent
        relatives, e.g. two sibling branches)."""
        params: dict[str, object] = {
            "repo": self.repository,
            "left": left,
            "right": right,
            "prefix": prefix,
            "plen": len(prefix),
        }
        cond_l = "AND substr(l.key, 1, :plen) = :prefix" if prefix else ""
        cond_r = "AND substr(r.key, 1, :plen) = :prefix" if prefix else ""
        rows = conn.execute(
            f"""
            SELECT l.key, l.sha, l.size, r.sha, r.size
            FROM trees l LEFT JOIN trees r
              ON r.repo = l.repo AND r.commit_id = :right AND r.key = l.key
            WHERE l.repo = :repo AND l.commit_id = :left {cond_l}
              AND (r.sha IS NULL OR r.sha != l.sha)
            UNION ALL
            SELECT r.key, NULL, NULL, r.sha, r.size
            FROM trees r
            WHERE r.repo = :repo AND r.commit_id = :right {cond_r}
              AND NOT EXISTS (
                SELECT 1 FROM trees l WHERE l.repo = :repo AND l.commit_id = :left AND l.key = r.key
              )
            """,
            params,
        )
        result: dict[str, _Change] = {}
        for key, l_sha, l_size, r_sha, r_size in rows:
            old = None if l_sha is None else _Value(l_sha, int(l_size))
            new = None if r_sha is None else _Value(r_sha, int(r_size))
            result[key] = (old, new)
        return result

    # ============================================================================ repository
    def ensure_repository(self) -> None:
        """Create the repository (branch ``main`` at a root commit) unless it exists."""
        with self._write() as conn:
            row = conn.execute("SELECT 1 FROM repositories WHERE name = ?", (self.repository,))
            if row.fetchone() is not None:
                return
            conn.execute(
                "INSERT INTO repositories (name, default_branch, created_at) VALUES (?, ?, ?)",
                (self.repository, DEFAULT_BRANCH, _now_iso()),
            )
            root = self._insert_commit(conn, [], {}, INITIAL_COMMIT_MESSAGE, {})
            conn.execute(
                "INSERT INTO branches (repo, name, head) VALUES (?, ?, ?)",
                (self.repository, DEFAULT_BRANCH, root),
            )

    # ============================================================================ branches
    def create_branch(
        self, name: str, source_ref: str = DEFAULT_BRANCH, exist_ok: bool = False
    ) -> BranchInfo:
        """See ``VersionedLake.create_branch``."""
        validate_branch_name(name)
        with self._write() as conn:
            self._require_repo(conn)
            existing = self._branch_head_or_none(conn, name)
            if existing is not None:
                if exist_ok:
                    return BranchInfo(name=name, head=existing)
                raise BranchExistsError(
                    f"branch {name!r} already exists in repository {self.repository!r}"
                )
            head = self._resolve(conn, source_ref)
            conn.execute(
                "INSERT INTO branches (repo, name, head) VALUES (?, ?, ?)",
                (self.repository, name, head),
            )
            return BranchInfo(name=name, head=head)

    def delete_branch(self, name: str) -> None:
        """See ``VersionedLake.delete_branch``."""
        validate_branch_name(name)
        if name == DEFAULT_BRANCH:
            raise LakeError(f"refusing to delete the default branch {DEFAULT_BRANCH!r}")
        with self._write() as conn:
            self._require_repo(conn)
            self._branch_head(conn, name)
            conn.execute(
                "DELETE FROM branches WHERE repo = ? AND name = ?", (self.repository, name)
            )
            conn.execute(
                "DELETE FROM staging WHERE repo = ? AND branch = ?", (self.repository, name)
            )

    def list_branches(self, prefix: str = "") -> list[BranchInfo]:
        """See ``VersionedLake.list_branches``."""
        with self._read() as conn:
            self._require_repo(conn)
            rows = conn.execute(
                "SELECT name, head FROM branches WHERE repo = ? ORDER BY name", (self.repository,)
            ).fetchall()
        return [BranchInfo(name=n, head=h) for n, h in rows if str(n).startswith(prefix)]

    def branch_exists(self, name: str) -> bool:
        """See ``VersionedLake.branch_exists``."""
        validate_branch_name(name)
        with self._read() as conn:
            self._require_repo(conn)
            return self._branch_head_or_none(conn, name) is not None

    def resolve_ref(self, ref: str) -> str:
        """See ``VersionedLake.resolve_ref``."""
        with self._read() as conn:
            self._require_repo(conn)
            return self._resolve(conn, ref)

    # ============================================================================ objects
    def put_object(self, branch: str, key: str, data: bytes) -> ObjectStat:
        """See ``VersionedLake.put_object``. Content is written (durably) before it is staged,
        so a staged entry never points at missing content."""
        validate_branch_name(branch)
        validate_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_object needs bytes, got {type(data).__name__}")
        with self._read() as conn:  # fail fast, before writing content, on a missing branch
            self._require_repo(conn)
            self._branch_head(conn, branch)
        value = self._write_blob(bytes(data))
        with self._write() as conn:
            self._branch_head(conn, branch)
            conn.execute(
                "INSERT OR REPLACE INTO staging (repo, branch, key, sha, size) "
                "VALUES (?, ?, ?, ?, ?)",
                (self.repository, branch, key, value.sha, value.size),
            )
        return ObjectStat(key=key, size=value.size, checksum=value.sha)

    # ---------------------------------------------------------------- resumable uploads
    @property
    def min_part_bytes(self) -> int:
        return int(self.upload_min_part_bytes)

    def _uploads(self) -> LocalUploads:
        return LocalUploads(self.root_path(), self.repository)

    def begin_upload(self, branch: str, key: str) -> UploadHandle:
        """See ``VersionedLake.begin_upload`` (parts live in ``local_uploads``)."""
        validate_branch_name(branch)
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            self._branch_head(conn, branch)
        return self._uploads().begin(branch, key)

    def upload_part(self, upload: UploadHandle, part_number: int, data: bytes) -> str:
        return self._uploads().put_part(upload, part_number, data)

    def uploaded_parts(self, upload: UploadHandle) -> dict[int, str]:
        return self._uploads().parts(upload)

    def complete_upload(self, upload: UploadHandle, parts: dict[int, str]) -> ObjectStat:
        uploads = self._uploads()
        stat = self.put_object(
            upload.branch, upload.key, uploads.joined(upload, parts, self.min_part_bytes)
        )
        uploads.discard(upload)
        return stat

    def abort_upload(self, upload: UploadHandle) -> None:
        self._uploads().discard(upload)

    def _stat(self, ref: str, key: str) -> _Value:
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            value = self._lookup(conn, ref, key)
        if value is None:
            raise NotFoundError(
                f"object {key!r} not found at ref {ref!r} in repository {self.repository!r}"
            )
        return value

    def get_object(self, ref: str, key: str) -> bytes:
        """See ``VersionedLake.get_object``; content is verified against its sha256."""
        return self._read_blob(self._stat(ref, key), key)

    def stat_object(self, ref: str, key: str) -> ObjectStat:
        """See ``VersionedLake.stat_object``."""
        value = self._stat(ref, key)
        return ObjectStat(key=key, size=value.size, checksum=value.sha)

    def object_exists(self, ref: str, key: str) -> bool:
        """See ``VersionedLake.object_exists``."""
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            return self._lookup(conn, ref, key) is not None

    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectStat]:
        """See ``VersionedLake.list_objects``."""
        validate_prefix(prefix)
        params: dict[str, object] = {
            "repo": self.repository,
            "branch": ref,
            "prefix": prefix,
            "plen": len(prefix),
        }
        cond = "AND substr(key, 1, :plen) = :prefix" if prefix else ""
        with self._read() as conn:
            self._require_repo(conn)
            head = self._branch_head_or_none(conn, ref)
            if head is None:
                params["commit"] = self._resolve(conn, ref)
                sql = (
                    "SELECT key, sha, size FROM trees "
                    f"WHERE repo = :repo AND commit_id = :commit {cond} ORDER BY key"
                )
            else:
                params["commit"] = head
                sql = f"""
                    SELECT key, sha, size FROM trees
                    WHERE repo = :repo AND commit_id = :commit {cond}
                      AND key NOT IN (
                        SELECT key FROM staging WHERE repo = :repo AND branch = :branch
                      )
                    UNION ALL
                    SELECT key, sha, size FROM staging
                    WHERE repo = :repo AND branch = :branch AND sha IS NOT NULL {cond}
                    ORDER BY key
                """
            rows = conn.execute(sql, params).fetchall()
        return [ObjectStat(key=k, size=int(size), checksum=sha) for k, sha, size in rows]

    def delete_object(self, branch: str, key: str) -> None:
        """See ``VersionedLake.delete_object``."""
        validate_branch_name(branch)
        validate_key(key)
        with self._write() as conn:
            self._require_repo(conn)
            self._branch_head(conn, branch)
            if self._lookup(conn, branch, key) is None:
                raise NotFoundError(f"object {key!r} not found on branch {branch!r}")
            conn.execute(
                "INSERT OR REPLACE INTO staging (repo, branch, key, sha, size) "
                "VALUES (?, ?, ?, NULL, NULL)",
                (self.repository, branch, key),
            )

    def uncommitted(self, branch: str) -> list[DiffEntry]:
        """See ``VersionedLake.uncommitted``."""
        validate_branch_name(branch)
        with self._read() as conn:
            self._require_repo(conn)
            head = self._branch_head(conn, branch)
            changes = self._staged_changes(conn, branch, head)
        return [_entry(key, change) for key, change in sorted(changes.items())]

    # ============================================================================ history
    def commit(
        self,
        branch: str,
        message: str,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> str:
        """See ``VersionedLake.commit``."""
        validate_branch_name(branch)
        meta = check_metadata(metadata)
        for _attempt in range(_CAS_RETRIES):
            try:
                with self._write() as conn:
                    self._require_repo(conn)
                    head = self._branch_head(conn, branch)
                    changes = self._staged_changes(conn, branch, head)
                    if not changes and not allow_empty:
                        raise NothingToCommitError(
                            f"nothing to commit on branch {branch!r}: no staged changes"
                        )
                    new_id = self._insert_commit(
                        conn, [head], {k: new for k, (_, new) in changes.items()}, message, meta
                    )
                    self._move_head(conn, branch, head, new_id)
                    conn.execute(
                        "DELETE FROM staging WHERE repo = ? AND branch = ?",
                        (self.repository, branch),
                    )
                    return new_id
            except _HeadMoved:
                continue
        raise ConcurrentUpdateError(
            f"branch {branch!r} kept moving; gave up committing after {_CAS_RETRIES} attempts"
        )

    def log(
        self, ref: str, limit: int | None = None, stop_at: str | None = None
    ) -> list[CommitInfo]:
        """See ``VersionedLake.log``. Order: generation descending, then newest first."""
        if limit is not None and limit < 0:
            raise LakeError(f"log limit must be >= 0, got {limit}")
        out: list[CommitInfo] = []
        with self._read() as conn:
            self._require_repo(conn)
            start = self._resolve(conn, ref)
            rows: dict[str, _CommitRow] = {}
            heap: list[tuple[int, float, str]] = []

            def push(cid: str) -> None:
                row = self._commit_row(conn, cid)
                rows[cid] = row
                stamp = datetime.fromisoformat(row.created_at).timestamp()
                heapq.heappush(heap, (-row.generation, -stamp, cid))

            push(start)
            while heap and (limit is None or len(out) < limit):
                _, _, cid = heapq.heappop(heap)
                if stop_at is not None and cid == stop_at:
                    break
                row = rows[cid]
                out.append(row.info())
                for parent in row.parents:
                    if parent not in rows:
                        push(parent)
        return out

    def diff(
        self, left_ref: str, right_ref: str, prefix: str = "", three_dot: bool = False
    ) -> list[DiffEntry]:
        """See ``VersionedLake.diff``."""
        validate_prefix(prefix)
        with self._read() as conn:
            self._require_repo(conn)
            left = self._resolve(conn, left_ref)
            right = self._resolve(conn, right_ref)
            if three_dot:
                left = self._merge_base(conn, left, right)
            changes = self._diff_commits(conn, left, right, prefix)
        return [_entry(key, change) for key, change in sorted(changes.items())]

    def merge(
        self,
        source_ref: str,
        destination_branch: str,
        message: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """See ``VersionedLake.merge``."""
        validate_branch_name(destination_branch)
        meta = check_metadata(metadata)
        for _attempt in range(_CAS_RETRIES):
            try:
                with self._write() as conn:
                    self._require_repo(conn)
                    dest_head = self._branch_head(conn, destination_branch)
                    if self._staged_changes(conn, destination_branch, dest_head):
                        raise LakeError(
                            f"cannot merge into {destination_branch!r}: it has uncommitted "
                            "changes; commit or discard them first"
                        )
                    source = self._resolve(conn, source_ref)
                    base = self._merge_base(conn, source, dest_head)
                    if base == source:
                        return dest_head  # already merged: nothing the destination lacks
                    from_source = self._diff_commits(conn, base, source)
                    from_dest = self._diff_commits(conn, base, dest_head)
                    conflicts = [
                        key
                        for key, (_, new) in from_source.items()
                        if key in from_dest and not _same(new, from_dest[key][1])
                    ]
                    if conflicts:
                        raise MergeConflictError(conflicts, source_ref, destination_branch)
                    to_apply = {
                        key: new for key, (_, new) in from_source.items() if key not in from_dest
                    }
                    text = message or f"Merge '{source_ref}' into '{destination_branch}'"
                    new_id = self._insert_commit(conn, [dest_head, source], to_apply, text, meta)
                    self._move_head(conn, destination_branch, dest_head, new_id)
                    return new_id
            except _HeadMoved:
                continue
        raise ConcurrentUpdateError(
            f"branch {destination_branch!r} kept moving; gave up merging after "
            f"{_CAS_RETRIES} attempts"
        )

    # ============================================================================ tags
    def create_tag(self, tag: str, ref: str) -> str:
        """See ``VersionedLake.create_tag``."""
        validate_tag_name(tag)
        with self._write() as conn:
            self._require_repo(conn)
            row = conn.execute(
                "SELECT commit_id FROM tags WHERE repo = ? AND name = ?", (self.repository, tag)
            ).fetchone()
            if row is not None:
                raise TagExistsError(f"tag {tag!r} already exists (at commit {row[0]})")
            commit_id = self._resolve(conn, ref)
            conn.execute(
                "INSERT INTO tags (repo, name, commit_id) VALUES (?, ?, ?)",
                (self.repository, tag, commit_id),
            )
            return commit_id

    def list_tags(self) -> dict[str, str]:
        """See ``VersionedLake.list_tags``."""
        with self._read() as conn:
            self._require_repo(conn)
            rows = conn.execute(
                "SELECT name, commit_id FROM tags WHERE repo = ? ORDER BY name", (self.repository,)
            ).fetchall()
        return {str(name): str(commit_id) for name, commit_id in rows}

    def delete_tag(self, tag: str) -> None:
        """See ``VersionedLake.delete_tag``."""
        validate_tag_name(tag)
        with self._write() as conn:
            self._require_repo(conn)
            cursor = conn.execute(
                "DELETE FROM tags WHERE repo = ? AND name = ?", (self.repository, tag)
            )
            if cursor.rowcount != 1:
                raise NotFoundError(f"tag {tag!r} not found in repository {self.repository!r}")
