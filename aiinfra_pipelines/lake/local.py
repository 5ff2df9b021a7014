"""``LocalLake``: the embedded ``VersionedLake`` adapter (SQLite history, content-addressed files).

It gives a laptop or CI run the same branch/commit/merge semantics as a lakeFS server without
running one. Layout under ``root`` (default ``<DAGSTER_HOME>/lake``)::

    lake.sqlite3                 repositories, branches, commits, trees, changes, staging, tags
    objects/<sha[:2]>/<sha>      object content, named by its sha256 (stored once)

The adapter is split by job: ``local_db`` (schema, transactions), ``local_blobs`` (the
content-addressed files), ``local_history`` (refs, trees, staging, commit creation),
``local_graph`` (merge bases, diffs) and ``local_uploads`` (resumable uploads). This module
holds the ``VersionedLake`` methods, which compose them. Concurrency: every commit, merge and
branch-head move runs in one write transaction and moves the head with compare-and-swap
(``UPDATE ... WHERE head = <expected>``), retried on conflict, so two processes committing to
the same branch serialise and neither commit is lost.
"""

from __future__ import annotations

import heapq
import os
import sqlite3
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path

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
from aiinfra_pipelines.lake.files import replacing_file
from aiinfra_pipelines.lake.keys import (
    validate_branch_name,
    validate_key,
    validate_prefix,
    validate_tag_name,
)
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local_blobs import (
    OBJECTS_DIRNAME,
    Value,
    copy_blob,
    read_blob,
    write_blob,
    write_blob_from_file,
    write_blob_stream,
)
from aiinfra_pipelines.lake.local_db import DB_FILENAME, read_transaction, write_transaction
from aiinfra_pipelines.lake.local_graph import diff_commits, merge_base
from aiinfra_pipelines.lake.local_history import (
    CommitRow,
    HeadMoved,
    branch_head,
    branch_head_or_none,
    commit_row,
    diff_entry,
    insert_commit,
    lookup,
    move_head,
    now_iso,
    resolve,
    same,
    staged_changes,
)
from aiinfra_pipelines.lake.local_uploads import LocalUploads
from aiinfra_pipelines.lake.port import (
    BranchInfo,
    CommitInfo,
    DiffEntry,
    ObjectStat,
    UploadHandle,
    VersionedLake,
    check_metadata,
)

# The file names are part of the on-disk layout that tools and tests locate.
__all__ = ["DB_FILENAME", "INITIAL_COMMIT_MESSAGE", "OBJECTS_DIRNAME", "LocalLake"]

INITIAL_COMMIT_MESSAGE = "Repository created"  # lakeFS's message for a repository's root commit
_CAS_RETRIES = 50


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

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        return read_transaction(self.root_path())

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self.root_path())

    # ------------------------------------------------------------------------ lookups
    def _require_repo(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT 1 FROM repositories WHERE name = ?", (self.repository,))
        if row.fetchone() is None:
            raise NotFoundError(
                f"repository {self.repository!r} not found under {self.root_path()}; "
                "call ensure_repository() first"
            )

    # ============================================================================ repository
    def ensure_repository(self) -> None:
        """Create the repository (branch ``main`` at a root commit) unless it exists."""
        with self._write() as conn:
            row = conn.execute("SELECT 1 FROM repositories WHERE name = ?", (self.repository,))
            if row.fetchone() is not None:
                return
            conn.execute(
                "INSERT INTO repositories (name, default_branch, created_at) VALUES (?, ?, ?)",
                (self.repository, MAIN_BRANCH, now_iso()),
            )
            root = insert_commit(conn, self.repository, [], {}, INITIAL_COMMIT_MESSAGE, {})
            conn.execute(
                "INSERT INTO branches (repo, name, head) VALUES (?, ?, ?)",
                (self.repository, MAIN_BRANCH, root),
            )

    # ============================================================================ branches
    def create_branch(
        self, name: str, source_ref: str = MAIN_BRANCH, exist_ok: bool = False
    ) -> BranchInfo:
        """See ``VersionedLake.create_branch``."""
        validate_branch_name(name)
        with self._write() as conn:
            self._require_repo(conn)
            existing = branch_head_or_none(conn, self.repository, name)
            if existing is not None:
                if exist_ok:
                    return BranchInfo(name=name, head=existing)
                raise BranchExistsError(
                    f"branch {name!r} already exists in repository {self.repository!r}"
                )
            head = resolve(conn, self.repository, source_ref)
            conn.execute(
                "INSERT INTO branches (repo, name, head) VALUES (?, ?, ?)",
                (self.repository, name, head),
            )
            return BranchInfo(name=name, head=head)

    def delete_branch(self, name: str) -> None:
        """See ``VersionedLake.delete_branch``."""
        validate_branch_name(name)
        if name == MAIN_BRANCH:
            raise LakeError(f"refusing to delete the default branch {MAIN_BRANCH!r}")
        with self._write() as conn:
            self._require_repo(conn)
            branch_head(conn, self.repository, name)
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
            return branch_head_or_none(conn, self.repository, name) is not None

    def resolve_ref(self, ref: str) -> str:
        """See ``VersionedLake.resolve_ref``."""
        with self._read() as conn:
            self._require_repo(conn)
            return resolve(conn, self.repository, ref)

    # ============================================================================ objects
    def _check_target(self, branch: str, key: str) -> None:
        """Validate a write's branch and key and fail fast, before any content is written, on a
        missing repository or branch."""
        validate_branch_name(branch)
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            branch_head(conn, self.repository, branch)

    def _stage(self, branch: str, key: str, value: Value) -> ObjectStat:
        """Stage stored content under ``key``. Content is always written (durably) before it
        is staged, so a staged entry never points at missing content."""
        with self._write() as conn:
            branch_head(conn, self.repository, branch)
            conn.execute(
                "INSERT OR REPLACE INTO staging (repo, branch, key, sha, size) "
                "VALUES (?, ?, ?, ?, ?)",
                (self.repository, branch, key, value.sha, value.size),
            )
        return ObjectStat(key=key, size=value.size, checksum=value.sha)

    def put_object(self, branch: str, key: str, data: bytes) -> ObjectStat:
        """See ``VersionedLake.put_object``."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_object needs bytes, got {type(data).__name__}")
        self._check_target(branch, key)
        return self._stage(branch, key, write_blob(self._objects_dir(), bytes(data)))

    def upload_file(self, branch: str, key: str, source: str | os.PathLike[str]) -> ObjectStat:
        """See ``VersionedLake.upload_file``: the file is hashed and copied into the content
        store in one pass, block by block, then staged as ``put_object`` stages."""
        self._check_target(branch, key)
        return self._stage(branch, key, write_blob_from_file(self._objects_dir(), source))

    def download_object(
        self, ref: str, key: str, destination: str | os.PathLike[str]
    ) -> ObjectStat:
        """See ``VersionedLake.download_object``: copied from the content file in blocks and
        verified against its sha256 on the way (``LakeError`` on a mismatch, and no file)."""
        value = self._stat(ref, key)
        with replacing_file(destination) as sink:
            copy_blob(self._objects_dir(), value, key, sink)
        return ObjectStat(key=key, size=value.size, checksum=value.sha)

    # ---------------------------------------------------------------- resumable uploads
    @property
    def min_part_bytes(self) -> int:
        return int(self.upload_min_part_bytes)

    def _uploads(self) -> LocalUploads:
        return LocalUploads(self.root_path(), self.repository)

    def begin_upload(self, branch: str, key: str) -> UploadHandle:
        """See ``VersionedLake.begin_upload`` (parts live in ``local_uploads``)."""
        self._check_target(branch, key)
        return self._uploads().begin(branch, key)

    def upload_part(self, upload: UploadHandle, part_number: int, data: bytes) -> str:
        return self._uploads().put_part(upload, part_number, data)

    def uploaded_parts(self, upload: UploadHandle) -> dict[int, str]:
        return self._uploads().parts(upload)

    def complete_upload(self, upload: UploadHandle, parts: dict[int, str]) -> ObjectStat:
        """See ``VersionedLake.complete_upload``. The parts are streamed into the content
        store (this is the path multi-GB logs take), then staged as ``put_object`` stages."""
        uploads = self._uploads()
        blocks = uploads.assemble(upload, parts, self.min_part_bytes)
        self._check_target(upload.branch, upload.key)
        value = write_blob_stream(self._objects_dir(), blocks)
        stat = self._stage(upload.branch, upload.key, value)
        uploads.discard(upload)
        return stat

    def abort_upload(self, upload: UploadHandle) -> None:
        self._uploads().discard(upload)

    def _stat(self, ref: str, key: str) -> Value:
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            value = lookup(conn, self.repository, ref, key)
        if value is None:
            raise NotFoundError(
                f"object {key!r} not found at ref {ref!r} in repository {self.repository!r}"
            )
        return value

    def get_object(self, ref: str, key: str) -> bytes:
        """See ``VersionedLake.get_object``; content is verified against its sha256."""
        return read_blob(self._objects_dir(), self._stat(ref, key), key)

    def stat_object(self, ref: str, key: str) -> ObjectStat:
        """See ``VersionedLake.stat_object``."""
        value = self._stat(ref, key)
        return ObjectStat(key=key, size=value.size, checksum=value.sha)

    def object_exists(self, ref: str, key: str) -> bool:
        """See ``VersionedLake.object_exists``."""
        validate_key(key)
        with self._read() as conn:
            self._require_repo(conn)
            return lookup(conn, self.repository, ref, key) is not None

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
            head = branch_head_or_none(conn, self.repository, ref)
            if head is None:
                params["commit"] = resolve(conn, self.repository, ref)
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
            branch_head(conn, self.repository, branch)
            if lookup(conn, self.repository, branch, key) is None:
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
            head = branch_head(conn, self.repository, branch)
            changes = staged_changes(conn, self.repository, branch, head)
        return [diff_entry(key, change) for key, change in sorted(changes.items())]

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
                    head = branch_head(conn, self.repository, branch)
                    changes = staged_changes(conn, self.repository, branch, head)
                    if not changes and not allow_empty:
                        raise NothingToCommitError(
                            f"nothing to commit on branch {branch!r}: no staged changes"
                        )
                    new_id = insert_commit(
                        conn,
                        self.repository,
                        [head],
                        {k: new for k, (_, new) in changes.items()},
                        message,
                        meta,
                    )
                    move_head(conn, self.repository, branch, head, new_id)
                    conn.execute(
                        "DELETE FROM staging WHERE repo = ? AND branch = ?",
                        (self.repository, branch),
                    )
                    return new_id
            except HeadMoved:
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
            start = resolve(conn, self.repository, ref)
            rows: dict[str, CommitRow] = {}
            heap: list[tuple[int, float, str]] = []

            def push(cid: str) -> None:
                row = commit_row(conn, self.repository, cid)
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
            left = resolve(conn, self.repository, left_ref)
            right = resolve(conn, self.repository, right_ref)
            if three_dot:
                left = merge_base(conn, self.repository, left, right)
            changes = diff_commits(conn, self.repository, left, right, prefix)
        return [diff_entry(key, change) for key, change in sorted(changes.items())]

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
                    dest_head = branch_head(conn, self.repository, destination_branch)
                    if staged_changes(conn, self.repository, destination_branch, dest_head):
                        raise LakeError(
                            f"cannot merge into {destination_branch!r}: it has uncommitted "
                            "changes; commit or discard them first"
                        )
                    source = resolve(conn, self.repository, source_ref)
                    base = merge_base(conn, self.repository, source, dest_head)
                    if base == source:
                        return dest_head  # already merged: nothing the destination lacks
                    from_source = diff_commits(conn, self.repository, base, source)
                    from_dest = diff_commits(conn, self.repository, base, dest_head)
                    conflicts = [
                        key
                        for key, (_, new) in from_source.items()
                        if key in from_dest and not same(new, from_dest[key][1])
                    ]
                    if conflicts:
                        raise MergeConflictError(conflicts, source_ref, destination_branch)
                    to_apply = {
                        key: new for key, (_, new) in from_source.items() if key not in from_dest
                    }
                    text = message or f"Merge '{source_ref}' into '{destination_branch}'"
                    new_id = insert_commit(
                        conn, self.repository, [dest_head, source], to_apply, text, meta
                    )
                    move_head(conn, self.repository, destination_branch, dest_head, new_id)
                    return new_id
            except HeadMoved:
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
            commit_id = resolve(conn, self.repository, ref)
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
