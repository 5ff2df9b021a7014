"""The commit store of ``LocalLake``: refs, trees, staging and commit creation, in SQL.

Each commit records its full key -> content tree (cheap reads at any commit) and its delta
against its first parent (what makes ancestor diffs cheap, ``local_graph``). Commit ids are the
sha256 of the commit's parents, tree digest, text and instant. Every function takes an open
connection (the caller owns the transaction) and the repository it works in.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple

from aiinfra_pipelines.lake.errors import LakeError, NotFoundError
from aiinfra_pipelines.lake.local_blobs import Value
from aiinfra_pipelines.lake.port import CommitInfo, DiffEntry

_HEX = re.compile(r"[0-9a-f]+")
_MIN_COMMIT_PREFIX = 6

# A key is either present with a Value or absent (None).
Slot = Value | None
# A change to one key: (value before, value after).
Change = tuple[Slot, Slot]


class CommitRow(NamedTuple):
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


class HeadMoved(Exception):
    """Internal: the compare-and-swap on a branch head lost a race; retry the operation."""


def same(a: Slot, b: Slot) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.sha == b.sha


def diff_entry(key: str, change: Change) -> DiffEntry:
    old, new = change
    if old is None and new is not None:
        return DiffEntry(key=key, type="added", size=new.size)
    if new is None and old is not None:
        return DiffEntry(key=key, type="removed", size=old.size)
    assert new is not None
    return DiffEntry(key=key, type="changed", size=new.size)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def branch_head_or_none(conn: sqlite3.Connection, repo: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT head FROM branches WHERE repo = ? AND name = ?", (repo, name)
    ).fetchone()
    return None if row is None else str(row[0])


def branch_head(conn: sqlite3.Connection, repo: str, name: str) -> str:
    head = branch_head_or_none(conn, repo, name)
    if head is None:
        raise NotFoundError(f"branch {name!r} not found in repository {repo!r}")
    return head


def resolve(conn: sqlite3.Connection, repo: str, ref: str) -> str:
    """Branch name, then tag, then full or unique-prefix commit id -> commit id."""
    if not isinstance(ref, str) or not ref:
        raise NotFoundError(f"ref {ref!r} not found in repository {repo!r}")
    head = branch_head_or_none(conn, repo, ref)
    if head is not None:
        return head
    row = conn.execute(
        "SELECT commit_id FROM tags WHERE repo = ? AND name = ?", (repo, ref)
    ).fetchone()
    if row is not None:
        return str(row[0])
    if _HEX.fullmatch(ref) and len(ref) >= _MIN_COMMIT_PREFIX:
        rows = conn.execute(
            "SELECT id FROM commits WHERE repo = ? AND id >= ? AND id < ? ORDER BY id LIMIT 2",
            (repo, ref, ref + "g"),
        ).fetchall()
        if len(rows) == 1:
            return str(rows[0][0])
        if len(rows) > 1:
            raise LakeError(f"commit id prefix {ref!r} is ambiguous; give more characters")
    raise NotFoundError(
        f"ref {ref!r} not found in repository {repo!r} (not a branch, tag or commit id)"
    )


def commit_row(conn: sqlite3.Connection, repo: str, commit_id: str) -> CommitRow:
    row = conn.execute(
        "SELECT id, parents, message, metadata, created_at, generation, tree_digest "
        "FROM commits WHERE repo = ? AND id = ?",
        (repo, commit_id),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"commit {commit_id!r} not found in repository {repo!r}")
    return CommitRow(
        id=row[0],
        parents=json.loads(row[1]),
        message=row[2],
        metadata=json.loads(row[3]),
        created_at=row[4],
        generation=int(row[5]),
        tree_digest=row[6],
    )


def tree_value(conn: sqlite3.Connection, repo: str, commit_id: str | None, key: str) -> Slot:
    if commit_id is None:
        return None
    row = conn.execute(
        "SELECT sha, size FROM trees WHERE repo = ? AND commit_id = ? AND key = ?",
        (repo, commit_id, key),
    ).fetchone()
    return None if row is None else Value(row[0], int(row[1]))


def lookup(conn: sqlite3.Connection, repo: str, ref: str, key: str) -> Slot:
    """The value of ``key`` at ``ref``; a branch ref sees its staged changes first."""
    head = branch_head_or_none(conn, repo, ref)
    if head is None:
        return tree_value(conn, repo, resolve(conn, repo, ref), key)
    row = conn.execute(
        "SELECT sha, size FROM staging WHERE repo = ? AND branch = ? AND key = ?",
        (repo, ref, key),
    ).fetchone()
    if row is not None:
        return None if row[0] is None else Value(row[0], int(row[1]))
    return tree_value(conn, repo, head, key)


def staged_changes(
    conn: sqlite3.Connection, repo: str, branch: str, head: str
) -> dict[str, Change]:
    """Staged entries of ``branch`` that really differ from its HEAD tree."""
    rows = conn.execute(
        "SELECT s.key, s.sha, s.size, t.sha, t.size FROM staging s "
        "LEFT JOIN trees t ON t.repo = s.repo AND t.commit_id = ? AND t.key = s.key "
        "WHERE s.repo = ? AND s.branch = ? ORDER BY s.key",
        (head, repo, branch),
    )
    changes: dict[str, Change] = {}
    for key, new_sha, new_size, old_sha, old_size in rows:
        old = None if old_sha is None else Value(old_sha, int(old_size))
        new = None if new_sha is None else Value(new_sha, int(new_size))
        if not same(old, new):
            changes[key] = (old, new)
    return changes


def digest_tree(
    conn: sqlite3.Connection, repo: str, base: str | None, delta: dict[str, Change]
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
            (repo, base),
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


def insert_commit(
    conn: sqlite3.Connection,
    repo: str,
    parents: list[str],
    changes: dict[str, Slot],
    message: str,
    metadata: dict[str, str],
) -> str:
    """Write a commit whose tree is ``parents[0]``'s tree with ``changes`` applied.

    Must run inside a write transaction. Records the full tree and the delta against the
    first parent (the delta is what makes ancestor diffs cheap).
    """
    first = parents[0] if parents else None
    generation = 1 + max((commit_row(conn, repo, p).generation for p in parents), default=0)
    delta: dict[str, Change] = {}
    for key, new in changes.items():
        old = tree_value(conn, repo, first, key)
        if not same(old, new):
            delta[key] = (old, new)
    tree_digest = digest_tree(conn, repo, first, delta)
    created_at = now_iso()
    commit_id = _commit_id(parents, tree_digest, message, metadata, created_at)
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
    _write_tree(conn, repo, commit_id, first, delta)
    return commit_id


def _commit_id(
    parents: list[str], tree_digest: str, message: str, metadata: dict[str, str], created_at: str
) -> str:
    """The commit's content address: its parents, tree, text and instant. Frozen: every
    commit id already in a LocalLake was computed from exactly this encoding."""
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
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _write_tree(
    conn: sqlite3.Connection,
    repo: str,
    commit_id: str,
    first: str | None,
    delta: dict[str, Change],
) -> None:
    """The new commit's full tree (its first parent's, with ``delta`` applied) and the delta
    itself, which is what makes ancestor diffs cheap."""
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
                diff_entry(key, change).type,
                None if change[1] is None else change[1].sha,
                None if change[1] is None else change[1].size,
            )
            for key, change in delta.items()
        ],
    )


def move_head(conn: sqlite3.Connection, repo: str, branch: str, expected: str, new: str) -> None:
    """Compare-and-swap the branch head; raise ``HeadMoved`` when another writer won."""
    cursor = conn.execute(
        "UPDATE branches SET head = ? WHERE repo = ? AND name = ? AND head = ?",
        (new, repo, branch, expected),
    )
    if cursor.rowcount != 1:
        raise HeadMoved(branch)
