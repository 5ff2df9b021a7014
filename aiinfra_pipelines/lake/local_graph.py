"""History walks of ``LocalLake``: merge bases and diffs between commits.

A diff between a commit and an ancestor on its first-parent line reads only the recorded
deltas of the commits in between, so a sensor that diffs "last seen" against ``main`` costs
O(new commits), not O(history x tree size). Commits that are not first-parent relatives (two
sibling branches) fall back to one SQL join of the two full trees.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterator

from aiinfra_pipelines.lake.errors import LakeError
from aiinfra_pipelines.lake.local_blobs import Value
from aiinfra_pipelines.lake.local_history import Change, CommitRow, commit_row, same, tree_value

SQL_CHUNK = 500  # bound on host parameters per IN (...) list


def chunks(items: list[str], size: int = SQL_CHUNK) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def merge_base(conn: sqlite3.Connection, repo: str, a: str, b: str) -> str:
    """A best common ancestor of ``a`` and ``b`` (highest generation).

    Walks both histories in generation order, painting commits with the side(s) they are
    reachable from; since a parent's generation is below all its children's, a commit's
    paint is final when it is popped, and the first commit painted by both sides is a
    common ancestor that no other common ancestor descends from.
    """
    if a == b:
        return a
    rows: dict[str, CommitRow] = {}
    paint: dict[str, int] = {a: 1, b: 2}
    heap: list[tuple[int, str]] = []
    for cid in (a, b):
        rows[cid] = commit_row(conn, repo, cid)
        heapq.heappush(heap, (-rows[cid].generation, cid))
    while heap:
        _, cid = heapq.heappop(heap)
        side = paint[cid]
        if side == 3:
            return cid
        for parent in rows[cid].parents:
            if parent not in rows:
                rows[parent] = commit_row(conn, repo, parent)
                paint[parent] = side
                heapq.heappush(heap, (-rows[parent].generation, parent))
            else:
                paint[parent] |= side
    raise LakeError(f"commits {a} and {b} share no history")


def first_parent_chain(
    conn: sqlite3.Connection, repo: str, start: str, target: str, target_generation: int
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
            "repo": repo,
            "start": start,
            "target": target,
            "generation": target_generation,
        },
    ).fetchall()
    ids = [str(row[0]) for row in rows]
    if target not in ids:
        return None
    return [cid for cid in ids if cid != target]


def diff_commits(
    conn: sqlite3.Connection, repo: str, left: str, right: str, prefix: str = ""
) -> dict[str, Change]:
    """Key -> (left value, right value) for every key that differs between two commits."""
    if left == right:
        return {}
    left_row = commit_row(conn, repo, left)
    right_row = commit_row(conn, repo, right)
    if left_row.tree_digest == right_row.tree_digest:
        return {}
    chain: list[str] | None = None
    if left_row.generation < right_row.generation:
        chain = first_parent_chain(conn, repo, right, left, left_row.generation)
    elif right_row.generation < left_row.generation:
        chain = first_parent_chain(conn, repo, left, right, right_row.generation)
    if chain is not None:
        return diff_delta(conn, repo, left, right, chain, prefix)
    return diff_full(conn, repo, left, right, prefix)


def diff_delta(
    conn: sqlite3.Connection, repo: str, left: str, right: str, chain: list[str], prefix: str
) -> dict[str, Change]:
    """Diff via the recorded deltas of the commits between two first-parent relatives:
    only keys some commit in ``chain`` touched can differ."""
    touched: set[str] = set()
    for chunk in chunks(chain):
        marks = ",".join("?" * len(chunk))
        touched.update(
            str(row[0])
            for row in conn.execute(
                f"SELECT DISTINCT key FROM changes WHERE repo = ? AND commit_id IN ({marks})",
                (repo, *chunk),
            )
        )
    result: dict[str, Change] = {}
    for key in sorted(touched):
        if prefix and not key.startswith(prefix):
            continue
        old = tree_value(conn, repo, left, key)
        new = tree_value(conn, repo, right, key)
        if not same(old, new):
            result[key] = (old, new)
    return result


def diff_full(
    conn: sqlite3.Connection, repo: str, left: str, right: str, prefix: str
) -> dict[str, Change]:
    """Diff by joining the two full trees (used when the commits are not first-parent
    relatives, e.g. two sibling branches)."""
    params: dict[str, object] = {
        "repo": repo,
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
    result: dict[str, Change] = {}
    for key, l_sha, l_size, r_sha, r_size in rows:
        old = None if l_sha is None else Value(l_sha, int(l_size))
        new = None if r_sha is None else Value(r_sha, int(r_size))
        result[key] = (old, new)
    return result
