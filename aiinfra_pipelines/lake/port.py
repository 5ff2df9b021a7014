"""The ``VersionedLake`` port: lakeFS semantics, independent of where the data lives.

Every asset, sensor and the IO manager talk to the lake only through this class, so the same
pipeline runs on the embedded ``LocalLake`` (laptop, CI) and on a lakeFS server (``LakeFSLake``).
The contract below is what both adapters implement and what ONE contract test suite checks:

* A repository has branches; ``main`` is the default branch and always exists.
* Writes (``put_object``/``delete_object``) are *staged* on a branch and become history only
  when ``commit`` is called. Reading through a *branch name* sees the staged state (like lakeFS);
  reading through a commit id or a tag sees that immutable commit.
* ``diff`` compares committed trees only: a branch name there means its HEAD commit.
* ``merge`` is a three-way merge against the merge base and never half-applies: on conflict the
  destination is untouched.
* Resumable uploads follow S3 multipart semantics (lakeFS serves them on its S3 gateway):
  ``begin_upload`` → ``upload_part`` (any order, a part re-sent replaces itself) →
  ``complete_upload`` stages the object in one step; ``uploaded_parts`` tells a restarted
  uploader what already arrived. Until completion nothing is visible on the branch.
* Objects larger than memory move between the lake and local files with ``upload_file`` and
  ``download_object``, which read and write in blocks (``files.BLOCK_BYTES``): a 3 GB drive
  log passes through a worker with well under 1 GB of RAM. ``get_object``/``put_object`` hold
  the whole object and are for objects that fit in memory.

Implementations translate their backend's failures into ``aiinfra_pipelines.lake.errors``.
"""

from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.errors import ConcurrentUpdateError, LakeError
from aiinfra_pipelines.lake.files import BLOCK_BYTES, replacing_file
from aiinfra_pipelines.lake.keys import validate_branch_name, validate_key
from aiinfra_pipelines.lake.layout import MAIN_BRANCH

logger = logging.getLogger(__name__)

DiffType = Literal["added", "removed", "changed"]
# S3's (and so lakeFS's gateway's) limit on the parts of one multipart upload.
MAX_UPLOAD_PARTS = 10_000


@dataclass(frozen=True)
class ObjectStat:
    """One object as seen at a ref.

    ``checksum`` identifies the content: sha256 hex for ``LocalLake``; lakeFS's checksum (the
    object store ETag) for ``LakeFSLake``. Compare checksums only within one adapter.
    """

    key: str
    size: int
    checksum: str


@dataclass(frozen=True)
class UploadHandle:
    """An open resumable upload: where it goes and the backend's id for it (persist all three
    to resume after a restart)."""

    branch: str
    key: str
    upload_id: str


@dataclass(frozen=True)
class CommitInfo:
    """A commit: ``parents`` is ``[]`` for the root, ``[destination, source]`` for a merge."""

    id: str
    parents: list[str]
    message: str
    metadata: dict[str, str]
    created_at: datetime


@dataclass(frozen=True)
class BranchInfo:
    """A branch and the commit id its HEAD points at."""

    name: str
    head: str


@dataclass(frozen=True)
class DiffEntry:
    """One changed key. ``size`` is the size on the side where the object exists (the new one
    for ``added``/``changed``, the old one for ``removed``); ``None`` when the backend omits it.
    """

    key: str
    type: DiffType
    size: int | None = field(default=None)


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """Return a copy of commit/merge metadata, refusing non-string keys or values.

    lakeFS stores metadata as ``map<string,string>``; silently stringifying ``1`` vs ``"1"``
    would make the two adapters disagree, so callers must pass strings.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise LakeError(f"commit metadata must be a dict[str, str], got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise LakeError(
                f"commit metadata must map str to str; got {key!r}: {value!r} "
                f"({type(key).__name__}: {type(value).__name__})"
            )
    return dict(metadata)


def _rebuild_resource(cls: type[VersionedLake], fields: dict[str, Any]) -> VersionedLake:
    """Unpickle helper: re-create a lake resource from its configuration fields."""
    return cls(**fields)


class VersionedLake(dg.ConfigurableResource):
    """Port to a lakeFS-style versioned data lake (repository ``repository``).

    A Dagster resource: configuration is plain pydantic fields, so an instance pickles and is
    re-created in every step subprocess. Adapters must not keep open connections in fields.
    The methods here raise ``NotImplementedError``; the text, JSON and Parquet helpers at the
    end are implemented once, on top of the abstract methods.
    """

    repository: str = "drive-data"

    def __reduce__(self) -> tuple[Any, ...]:
        # A ConfigurableResource's pickled state carries Dagster's internal config-schema
        # objects, which do not unpickle (dagster 1.13). A lake is fully described by its
        # fields, so pickle exactly those; private runtime state (clients) is rebuilt lazily.
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return (_rebuild_resource, (type(self), fields))

    # ----------------------------------------------------------------------------- repository
    def ensure_repository(self) -> None:
        """Create the repository if missing, with default branch ``main`` and an initial commit.

        Idempotent: calling it on an existing repository changes nothing. Every other method
        raises ``NotFoundError`` while the repository does not exist.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------------------- branches
    def create_branch(
        self, name: str, source_ref: str = MAIN_BRANCH, exist_ok: bool = False
    ) -> BranchInfo:
        """Create branch ``name`` pointing at the commit ``source_ref`` resolves to.

        The new branch starts with no staged changes (uncommitted writes on a source branch are
        not copied). Raises ``InvalidKeyError`` for a bad name, ``NotFoundError`` when
        ``source_ref`` does not resolve, and ``BranchExistsError`` when the branch exists and
        ``exist_ok`` is false; with ``exist_ok`` the existing branch is returned unchanged.
        """
        raise NotImplementedError

    def delete_branch(self, name: str) -> None:
        """Delete branch ``name`` and its staged changes; its commits stay reachable by id/tag.

        Refuses (``LakeError``) to delete ``main``; ``NotFoundError`` if the branch is missing.
        """
        raise NotImplementedError

    def list_branches(self, prefix: str = "") -> list[BranchInfo]:
        """Branches whose name starts with ``prefix``, sorted by name."""
        raise NotImplementedError

    def branch_exists(self, name: str) -> bool:
        """Whether branch ``name`` exists (``InvalidKeyError`` for a malformed name)."""
        raise NotImplementedError

    def resolve_ref(self, ref: str) -> str:
        """The commit id a branch name (its HEAD), tag or commit id points at.

        ``NotFoundError`` when ``ref`` names nothing.
        """
        raise NotImplementedError

    # -------------------------------------------------------------------------------- objects
    def put_object(self, branch: str, key: str, data: bytes) -> ObjectStat:
        """Stage ``data`` under ``key`` on ``branch`` (overwriting); visible on the branch at once
        and in history after ``commit``. ``InvalidKeyError`` for a bad key, ``NotFoundError``
        for a missing branch.
        """
        raise NotImplementedError

    def get_object(self, ref: str, key: str) -> bytes:
        """The content of ``key`` at ``ref``.

        A branch name reads the staged state, including uncommitted writes and deletes (as
        lakeFS does); a commit id or tag reads that commit. ``NotFoundError`` when the ref or
        the object does not exist there.
        """
        raise NotImplementedError

    def stat_object(self, ref: str, key: str) -> ObjectStat:
        """Size and checksum of ``key`` at ``ref`` (same visibility rules as ``get_object``)."""
        raise NotImplementedError

    def object_exists(self, ref: str, key: str) -> bool:
        """Whether ``key`` exists at ``ref``; ``NotFoundError`` only when the ref itself is
        missing."""
        raise NotImplementedError

    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectStat]:
        """All objects at ``ref`` whose key starts with ``prefix`` (string prefix), sorted by key.

        Same visibility rules as ``get_object``: a branch lists its staged state.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------- large objects, files
    def download_object(
        self, ref: str, key: str, destination: str | os.PathLike[str]
    ) -> ObjectStat:
        """Write the content of ``key`` at ``ref`` to the file ``destination`` and return its
        ``ObjectStat`` (size and checksum as ``stat_object`` reports them).

        For objects larger than memory: adapters copy in blocks. ``destination`` is created or
        replaced only once the download is complete (a temporary sibling is renamed over it), so
        a failure — ``NotFoundError`` as for ``get_object``, a lost connection, content that
        fails its checksum — leaves no file, or the previous one, under that name. An object
        that is replaced on its branch while it is being read raises ``ConcurrentUpdateError``.

        This default reads the object whole with ``get_object``, for adapters that cannot
        stream; ``LocalLake`` and ``LakeFSLake`` override it with streaming copies.
        """
        validate_key(key)
        before = self.stat_object(ref, key)
        data = self.get_object(ref, key)
        if len(data) != before.size:
            raise ConcurrentUpdateError(
                f"{key!r} at {ref!r} changed while it was downloaded ({before.size} bytes "
                f"announced, {len(data)} read); download it again"
            )
        with replacing_file(destination) as sink:
            sink.write(data)
        return before

    def upload_file(self, branch: str, key: str, source: str | os.PathLike[str]) -> ObjectStat:
        """Stage the content of the file ``source`` under ``key`` on ``branch``, as
        ``put_object`` would, reading the file in blocks (never whole).

        Errors as for ``put_object``; an ``OSError`` when ``source`` cannot be read. Nothing is
        staged unless the whole file arrived.

        This default sends a file that fits in one part (``_upload_file_part_bytes``) with
        ``put_object`` and anything larger as a resumable upload, one part in memory at a time;
        an upload that fails is aborted so no parts are left behind.
        """
        validate_branch_name(branch)
        validate_key(key)
        with open(source, "rb") as handle:
            part_bytes = self._upload_file_part_bytes(os.fstat(handle.fileno()).st_size)
            chunk = handle.read(part_bytes)
            peek = handle.read(1)  # the size may have changed since fstat: the read decides
            if not peek:
                return self.put_object(branch, key, chunk)
            upload = self.begin_upload(branch, key)
            try:
                etags: dict[int, str] = {}
                number = 1
                while chunk:
                    etags[number] = self.upload_part(upload, number, chunk)
                    number += 1
                    chunk = peek + handle.read(part_bytes - 1) if peek else handle.read(part_bytes)
                    peek = b""
                return self.complete_upload(upload, etags)
            except BaseException:
                try:
                    self.abort_upload(upload)
                except Exception as abort_error:  # the original failure is the one to report
                    logger.warning(
                        "could not abort upload %s of %s on %s: %s",
                        upload.upload_id,
                        key,
                        branch,
                        abort_error,
                    )
                raise

    def _upload_file_part_bytes(self, size: int) -> int:
        """The part size ``upload_file`` uses for a file of about ``size`` bytes: at least
        ``min_part_bytes`` and one block, and large enough that the file fits in S3's
        ``MAX_UPLOAD_PARTS`` parts. Memory use is about one part."""
        return max(self.min_part_bytes, BLOCK_BYTES, -(-size // MAX_UPLOAD_PARTS))

    # ---------------------------------------------------------------- resumable uploads
    @property
    def min_part_bytes(self) -> int:
        """Smallest size of a part that is not the last one (S3's 5 MiB)."""
        raise NotImplementedError

    def begin_upload(self, branch: str, key: str) -> UploadHandle:
        """Start a resumable upload of ``key`` to ``branch``; ``NotFoundError`` for a missing
        branch, ``InvalidKeyError`` for a bad key."""
        raise NotImplementedError

    def upload_part(self, upload: UploadHandle, part_number: int, data: bytes) -> str:
        """Store part ``part_number`` (1-based) of ``upload``; returns its ETag. Sending a part
        again replaces it. ``NotFoundError`` when the upload was completed or aborted."""
        raise NotImplementedError

    def uploaded_parts(self, upload: UploadHandle) -> dict[int, str]:
        """Part number → ETag of what already arrived; ``NotFoundError`` when the upload is no
        longer open (completed or aborted)."""
        raise NotImplementedError

    def complete_upload(self, upload: UploadHandle, parts: dict[int, str]) -> ObjectStat:
        """Join ``parts`` (number → ETag, numbers consecutive from 1) into the object, staged
        on the branch. ``LakeError`` when a part is missing, its ETag differs, or a part other
        than the last is smaller than ``min_part_bytes``."""
        raise NotImplementedError

    def abort_upload(self, upload: UploadHandle) -> None:
        """Discard an open upload and its parts (no-op when it is already gone)."""
        raise NotImplementedError

    def delete_object(self, branch: str, key: str) -> None:
        """Stage the deletion of ``key`` on ``branch``; ``NotFoundError`` if it is not there."""
        raise NotImplementedError

    def uncommitted(self, branch: str) -> list[DiffEntry]:
        """The staged changes on ``branch`` relative to its HEAD commit, sorted by key.

        Staging identical content over a committed object is not a change.
        """
        raise NotImplementedError

    # -------------------------------------------------------------------------------- history
    def commit(
        self,
        branch: str,
        message: str,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> str:
        """Commit the staged changes of ``branch`` and return the new commit id.

        The new commit's single parent is the branch HEAD at the moment of the commit, so
        concurrent committers serialise and never lose a commit. Staging belongs to the branch,
        not to a writer (as in lakeFS): a commit takes everything staged on the branch, so a
        concurrent writer's puts may land in this commit and leave that writer's own commit
        empty; writers that share a branch therefore pass ``allow_empty=True``, and runs that
        need isolation write on their own branch and ``merge``. Raises
        ``NothingToCommitError`` when nothing is staged and ``allow_empty`` is false, and
        ``ConcurrentUpdateError`` if the head could not be updated after retries.
        """
        raise NotImplementedError

    def log(
        self, ref: str, limit: int | None = None, stop_at: str | None = None
    ) -> list[CommitInfo]:
        """Commits reachable from ``ref``, newest first, in topological order (a commit always
        comes before its parents; merges include both parents' ancestry, as lakeFS's log does).

        ``limit`` caps the number returned. ``stop_at`` is a commit id: the walk stops when it
        reaches it, and it is not included, which is how a sensor asks for "only what is new
        since the commit I last saw". (The walk is in the order above, so on a history with
        merges a side-branch commit ordered after ``stop_at`` is cut off with it; every merge
        commit on the ref's first-parent line newer than ``stop_at`` is returned when ``stop_at``
        is itself on that line, as a sensor's last-seen ``main`` head is.)
        """
        raise NotImplementedError

    def diff(
        self, left_ref: str, right_ref: str, prefix: str = "", three_dot: bool = False
    ) -> list[DiffEntry]:
        """The changes that turn ``left_ref``'s committed tree into ``right_ref``'s, sorted by key.

        ``added`` means present on the right only. Branch names mean their HEAD commit, never
        staged changes. With ``three_dot`` the left side is the merge base of the two refs, so
        the result is what ``right_ref`` changed since they forked (what a merge would bring).
        """
        raise NotImplementedError

    def merge(
        self,
        source_ref: str,
        destination_branch: str,
        message: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Three-way merge ``source_ref`` into ``destination_branch``; return the resulting head.

        Normally a new merge commit with parents ``[destination HEAD, source commit]`` (also
        when the source brings no net change). When the source commit is already an ancestor of
        the destination nothing is created and the destination HEAD is returned, so re-running
        a publish step is harmless. A key changed differently on both sides since the merge
        base raises ``MergeConflictError`` (naming the keys) and leaves the destination
        untouched. Refuses (``LakeError``) when the destination has uncommitted changes.
        """
        raise NotImplementedError

    # ----------------------------------------------------------------------------------- tags
    def create_tag(self, tag: str, ref: str) -> str:
        """Tag the commit ``ref`` resolves to; return that commit id.

        ``TagExistsError`` if the tag exists (tags are immutable dataset identifiers).
        """
        raise NotImplementedError

    def list_tags(self) -> dict[str, str]:
        """All tags as ``{tag: commit id}``."""
        raise NotImplementedError

    def delete_tag(self, tag: str) -> None:
        """Delete a tag (``NotFoundError`` if missing); the commit itself is kept."""
        raise NotImplementedError

    # ------------------------------------------------------------- concrete convenience helpers
    def put_text(self, branch: str, key: str, text: str, encoding: str = "utf-8") -> ObjectStat:
        """Stage ``text`` encoded with ``encoding`` under ``key``."""
        return self.put_object(branch, key, text.encode(encoding))

    def get_text(self, ref: str, key: str, encoding: str = "utf-8") -> str:
        """Read ``key`` at ``ref`` and decode it with ``encoding``."""
        return self.get_object(ref, key).decode(encoding)

    def put_json(self, branch: str, key: str, value: Any) -> ObjectStat:
        """Stage ``value`` as a JSON document (``encoding.json_document``): sorted keys, so
        equal values give identical bytes (and therefore deduplicate and produce no spurious
        diff)."""
        return self.put_object(branch, key, json_document(value))

    def get_json(self, ref: str, key: str) -> Any:
        """Read ``key`` at ``ref`` and parse it as JSON."""
        return json.loads(self.get_text(ref, key))

    def get_json_or_none(self, ref: str, key: str) -> Any | None:
        """``get_json``, or ``None`` when ``key`` is not at ``ref``: for pointers and records
        that legitimately do not exist yet (before the first dataset, candidate, rollout)."""
        return self.get_json(ref, key) if self.object_exists(ref, key) else None

    def get_parquet(self, ref: str, key: str, columns: list[str] | None = None) -> pd.DataFrame:
        """Read the Parquet object ``key`` at ``ref`` as a DataFrame (only ``columns``, if
        given: frame tables are wide, and most readers want a few reference columns)."""
        return pd.read_parquet(io.BytesIO(self.get_object(ref, key)), columns=columns)
