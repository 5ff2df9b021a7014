"""``LakeFSLake``: the ``VersionedLake`` port on a lakeFS server, via the ``lakefs`` SDK.

Written against ``lakefs`` 0.16 (the high-level wrapper over ``lakefs-sdk`` 1.x). Where the
wrapper has no call for what we need (listing branches/tags together with their commit ids,
finding a merge base) we use ``client.sdk_client.<api>`` from the same SDK, through the SDK's
own ``generate_listing``/``api_exception_handler`` so errors arrive as ``lakefs.exceptions``.

lakeFS facts this adapter relies on (checked against the lakeFS server source):

* ``diff_refs`` defaults to a *three-dot* compare; ``type="two_dot"`` gives ``left..right``
  (``added`` = only on the right), the orientation of ``LocalLake``. Both refs are resolved to
  commit ids first, so a branch means its HEAD commit and staged changes never leak in.
* A commit with nothing staged fails with 400 "no changes" (mapped to ``NothingToCommitError``);
  a merge conflict is 409 without the conflicting paths, so we recompute them from diffs.
* A merge into a branch with uncommitted changes fails (dirty branch); we check first to raise
  a clear ``LakeError``.

Production concerns (issue 7):

* Every HTTP request of the SDK goes through ``lakefs_transport.RetryingPoolManager``: finite
  connect/read timeouts and ``RetryPolicy`` (exponential backoff, full jitter) on 5xx,
  timeouts and connection errors, never on 4xx. Exhausted retries raise
  ``LakeUnavailableError``; 401/403 raise ``LakeAuthError``.
* ``object_io="s3_gateway"`` moves object bytes (``put_object``/``get_object``/
  ``download_object``) to lakeFS's S3 gateway (``s3_gateway.S3Gateway``: bucket = repository,
  key = ``<ref>/<path>``, multipart above a threshold); metadata calls (stat, list, diff,
  commit, ...) stay on the API.
* ``download_object`` streams (ranged reads on the API, a streamed GET on the gateway);
  ``upload_file`` sends a file larger than one part (``multipart_part_mb``) as a multipart
  upload through the gateway, part by part, like the resumable uploads.
* Credentials are never part of ``repr``, messages or logs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, BinaryIO

import dagster as dg
import lakefs
import lakefs_sdk
from lakefs import exceptions as lakefs_exc
from lakefs.exceptions import api_exception_handler
from lakefs.models import Change, ObjectInfo
from lakefs.reference import generate_listing
from pydantic import Field, PrivateAttr
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from aiinfra_pipelines.lake.errors import (
    BranchExistsError,
    ConcurrentUpdateError,
    LakeAuthError,
    LakeError,
    LakeUnavailableError,
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
from aiinfra_pipelines.lake.lakefs_transport import ServerError
from aiinfra_pipelines.lake.lakefs_transport import install as install_transport
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import (
    BranchInfo,
    CommitInfo,
    DiffEntry,
    ObjectStat,
    UploadHandle,
    VersionedLake,
    check_metadata,
)
from aiinfra_pipelines.lake.retry import RetryPolicy, attempts_made

if TYPE_CHECKING:
    from aiinfra_pipelines.lake.s3_gateway import S3Gateway

_DIFF_TYPES = ("added", "removed", "changed")
OBJECT_IO_MODES = ("api", "s3_gateway")
S3_MIN_PART_BYTES = 5 * 1024 * 1024  # S3 (and lakeFS's gateway): every part but the last
_API_SUFFIX = "/api/v1"
_TRANSFER_KEYS = frozenset({"multipart_threshold_mb", "multipart_part_mb", "multipart_concurrency"})
_TIMEOUT_KEYS = frozenset({"connect_s", "read_s"})
_MIB = 1024 * 1024
# ``download_object`` over the API reads an object in ranges of this size. Each range is one
# HTTP request held in memory whole (the SDK reads a response body at once), so it is bigger
# than a file block, to keep a 3 GB log at a few hundred requests, and small enough for RAM.
API_READ_BYTES = 8 * _MIB


def _resolve_config(value: str) -> str:
    """The real value of a config field.

    Inside ``Definitions`` Dagster swaps ``EnvVar`` fields for their values; a resource used
    directly (CLI, scripts, tests) still holds the ``EnvVar`` object, whose ``str`` is the
    variable *name*, so resolve it here.
    """
    if isinstance(value, dg.EnvVar):
        return value.get_value() or ""
    return value


def _message(exc: BaseException) -> str:
    """The server's error message when there is one, else the exception text."""
    body: Any = getattr(exc, "body", None)
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, TypeError):
            return str(body) or str(exc)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    reason = getattr(exc, "reason", None)
    return f"{reason}" if reason else (str(exc) or type(exc).__name__)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


@contextmanager
def _translate(what: str) -> Iterator[None]:
    """Map SDK exceptions raised inside the block to ``aiinfra_pipelines.lake.errors``."""
    try:
        yield
    except LakeError:
        raise
    except ServerError as exc:
        raise LakeUnavailableError(
            f"{what}: lakeFS answered HTTP {exc.status} ({exc.message}) after {exc.attempts} "
            f"attempt(s){_unknown_outcome(exc.method, exc.status)}"
        ) from exc
    except Urllib3HTTPError as exc:  # connection refused, DNS, timeouts, dropped connections
        attempts = attempts_made(exc) or 1
        raise LakeUnavailableError(
            f"{what}: lakeFS unreachable after {attempts} attempt(s): {type(exc).__name__}: {exc}"
        ) from exc
    except lakefs_exc.NotFoundException as exc:
        raise NotFoundError(f"{what}: not found ({_message(exc)})") from exc
    except lakefs_exc.LakeFSException as exc:
        if _status(exc) in (401, 403):
            raise LakeAuthError(
                f"{what}: lakeFS refused the credentials or permission "
                f"(HTTP {_status(exc)}): {_message(exc)}"
            ) from exc
        raise LakeError(f"{what}: {_message(exc)}") from exc
    except lakefs_sdk.ApiException as exc:  # calls the wrapper does not translate (presign)
        if exc.status == 404:
            raise NotFoundError(f"{what}: not found ({_message(exc)})") from exc
        if exc.status in (401, 403):
            raise LakeAuthError(f"{what}: HTTP {exc.status}: {_message(exc)}") from exc
        raise LakeError(f"{what}: HTTP {exc.status}: {_message(exc)}") from exc


def _unknown_outcome(method: str, status: int) -> str:
    """A hint when a write may have been applied although it failed (see ``retry``)."""
    if method == "POST" and status not in (502, 503):
        return "; a POST is not repeated after this status, it may have been applied: check"
    return ""


def _diff_entries(changes: Iterator[Change]) -> list[DiffEntry]:
    entries = [
        DiffEntry(key=c.path, type=c.type, size=c.size_bytes)
        for c in changes
        if c.path_type == "object" and c.type in _DIFF_TYPES
    ]
    return sorted(entries, key=lambda e: e.key)


def _commit_info(commit: lakefs.Commit) -> CommitInfo:
    return CommitInfo(
        id=commit.id,
        parents=list(commit.parents or []),
        message=commit.message,
        metadata=dict(commit.metadata or {}),
        created_at=datetime.fromtimestamp(commit.creation_date, tz=UTC),
    )


def _gateway_from_api_endpoint(endpoint: str) -> str:
    """lakeFS serves its S3 gateway on the API's host and port, at the root path."""
    endpoint = endpoint.rstrip("/")
    if endpoint.endswith(_API_SUFFIX):
        endpoint = endpoint[: -len(_API_SUFFIX)]
    return endpoint


class LakeFSLake(VersionedLake):
    """``VersionedLake`` on a lakeFS server.

    ``storage_namespace`` (e.g. ``s3://bucket/drive-data``) is only needed to *create* the
    repository. The SDK client (a urllib3 pool) is built lazily and never pickled: a pickled
    resource carries only its fields (see ``VersionedLake.__reduce__``).
    """

    endpoint: str
    access_key_id: str = Field(repr=False)
    secret_access_key: str = Field(repr=False)
    storage_namespace: str = ""
    # "api": object bytes through the lakeFS REST API; "s3_gateway": through lakeFS's S3 gateway.
    object_io: str = "api"
    # The S3 gateway's URL; empty = the API endpoint's scheme://host:port (lakeFS's default).
    s3_gateway_endpoint: str = ""
    s3_region: str = "us-east-1"
    multipart_threshold_mb: int = 64
    multipart_part_mb: int = 16
    multipart_concurrency: int = 4
    retry_max_attempts: int = 5
    retry_initial_backoff_s: float = 0.5
    retry_max_backoff_s: float = 20.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0

    _client: Any = PrivateAttr(default=None)
    _gateway: Any = PrivateAttr(default=None)

    # ============================================================================ plumbing
    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LakeFSLake:
        """The adapter an environment's ``lake:`` section describes (``adapter: lakefs``).

        Endpoint and credentials are ``dg.EnvVar``s (``LAKEFS_ENDPOINT``,
        ``LAKEFS_ACCESS_KEY_ID``, ``LAKEFS_SECRET_ACCESS_KEY``), resolved only when a run uses
        the resource, so building it contacts nothing and needs no secret. An unknown key in
        ``transfer``/``retry``/``timeouts`` is refused (a typo must not silently fall back).
        """
        transfer = dict(settings.get("transfer") or {})
        retry = RetryPolicy.from_settings(settings.get("retry"))
        timeouts = dict(settings.get("timeouts") or {})
        for section, given, known in (
            ("transfer", transfer, _TRANSFER_KEYS),
            ("timeouts", timeouts, _TIMEOUT_KEYS),
        ):
            unknown = sorted(set(given) - known)
            if unknown:
                raise ValueError(f"unknown lake.{section} setting(s) {unknown}")
        defaults = cls.model_fields
        return cls(
            repository=settings["repository"],
            endpoint=dg.EnvVar("LAKEFS_ENDPOINT"),
            access_key_id=dg.EnvVar("LAKEFS_ACCESS_KEY_ID"),
            secret_access_key=dg.EnvVar("LAKEFS_SECRET_ACCESS_KEY"),
            storage_namespace=settings.get("storage_namespace", ""),
            object_io=settings.get("object_io", defaults["object_io"].default),
            s3_gateway_endpoint=settings.get("s3_gateway_endpoint") or "",
            s3_region=settings.get("s3_region", defaults["s3_region"].default),
            multipart_threshold_mb=transfer.get(
                "multipart_threshold_mb", defaults["multipart_threshold_mb"].default
            ),
            multipart_part_mb=transfer.get(
                "multipart_part_mb", defaults["multipart_part_mb"].default
            ),
            multipart_concurrency=transfer.get(
                "multipart_concurrency", defaults["multipart_concurrency"].default
            ),
            retry_max_attempts=retry.max_attempts,
            retry_initial_backoff_s=retry.initial_backoff_s,
            retry_max_backoff_s=retry.max_backoff_s,
            connect_timeout_s=timeouts.get("connect_s", defaults["connect_timeout_s"].default),
            read_timeout_s=timeouts.get("read_s", defaults["read_timeout_s"].default),
        )

    def retry_policy(self) -> RetryPolicy:
        """The configured ``RetryPolicy`` (validated: a bad value fails at first use)."""
        return RetryPolicy(
            max_attempts=self.retry_max_attempts,
            initial_backoff_s=self.retry_initial_backoff_s,
            max_backoff_s=self.retry_max_backoff_s,
        )

    @property
    def client(self) -> lakefs.Client:
        """The ``lakefs.Client`` for this server (created on first use), its HTTP transport
        replaced by one with timeouts and the retry policy."""
        if self._client is None:
            endpoint = _resolve_config(self.endpoint)
            if not endpoint:
                raise LakeError(
                    "LakeFSLake has no endpoint: set LAKEFS_ENDPOINT (e.g. https://lakefs:8000)"
                )
            client = lakefs.Client(
                host=endpoint,
                username=_resolve_config(self.access_key_id),
                password=_resolve_config(self.secret_access_key),
            )
            install_transport(
                client.sdk_client._api,
                self.retry_policy(),
                connect_timeout_s=self.connect_timeout_s,
                read_timeout_s=self.read_timeout_s,
            )
            self._client = client
        return self._client

    def gateway(self) -> S3Gateway:
        """The S3 gateway client (bucket = repository, key = ``<ref>/<path>``), created lazily."""
        if self._gateway is None:
            from aiinfra_pipelines.lake.s3_gateway import MIB, S3Gateway, TransferSettings

            endpoint = _resolve_config(self.s3_gateway_endpoint) or _gateway_from_api_endpoint(
                _resolve_config(self.endpoint)
            )
            self._gateway = S3Gateway(
                endpoint,
                _resolve_config(self.access_key_id),
                _resolve_config(self.secret_access_key),
                region=self.s3_region,
                policy=self.retry_policy(),
                transfer=TransferSettings(
                    multipart_threshold_bytes=self.multipart_threshold_mb * MIB,
                    part_size_bytes=self.multipart_part_mb * MIB,
                    max_concurrency=self.multipart_concurrency,
                    connect_timeout_s=self.connect_timeout_s,
                    read_timeout_s=self.read_timeout_s,
                ),
            )
        return self._gateway

    def _via_gateway(self) -> bool:
        if self.object_io not in OBJECT_IO_MODES:
            raise LakeError(
                f"LakeFSLake.object_io={self.object_io!r}: expected one of {OBJECT_IO_MODES}"
            )
        return self.object_io == "s3_gateway"

    def _repo(self) -> lakefs.Repository:
        return lakefs.Repository(self.repository, client=self.client)

    def _where(self, ref: str, key: str | None = None) -> str:
        where = f"lakefs://{self.repository}/{ref}"
        return f"{where}/{key}" if key is not None else where

    # ============================================================================ repository
    def ensure_repository(self) -> None:
        """See ``VersionedLake.ensure_repository``; lakeFS creates ``main`` and the root commit."""
        repo = self._repo()
        with _translate(f"repository {self.repository!r}"):
            try:
                repo.properties  # noqa: B018 - GET /repositories/{id}
                return
            except lakefs_exc.NotFoundException:
                pass
            namespace = _resolve_config(self.storage_namespace)
            if not namespace:
                raise LakeError(
                    f"repository {self.repository!r} does not exist and no storage_namespace is "
                    "configured to create it (e.g. s3://bucket/drive-data)"
                )
            repo.create(storage_namespace=namespace, default_branch=MAIN_BRANCH, exist_ok=True)

    # ============================================================================ branches
    def create_branch(
        self, name: str, source_ref: str = MAIN_BRANCH, exist_ok: bool = False
    ) -> BranchInfo:
        """See ``VersionedLake.create_branch``."""
        validate_branch_name(name)
        branch = self._repo().branch(name)
        with _translate(f"create branch {name!r} from {source_ref!r}"):
            try:
                branch.create(source_ref)
            except lakefs_exc.ConflictException as exc:
                if not exist_ok:
                    raise BranchExistsError(
                        f"branch {name!r} already exists in repository {self.repository!r}"
                    ) from exc
            return BranchInfo(name=name, head=branch.head.id)

    def delete_branch(self, name: str) -> None:
        """See ``VersionedLake.delete_branch``."""
        validate_branch_name(name)
        if name == MAIN_BRANCH:
            raise LakeError(f"refusing to delete the default branch {MAIN_BRANCH!r}")
        with _translate(f"delete branch {self._where(name)}"):
            self._repo().branch(name).delete()

    def list_branches(self, prefix: str = "") -> list[BranchInfo]:
        """See ``VersionedLake.list_branches``."""
        api = self.client.sdk_client.branches_api
        with _translate(f"list branches of {self.repository!r}"):
            refs = list(generate_listing(api.list_branches, self.repository, prefix=prefix or None))
        return sorted((BranchInfo(name=r.id, head=r.commit_id) for r in refs), key=lambda b: b.name)

    def branch_exists(self, name: str) -> bool:
        """See ``VersionedLake.branch_exists``."""
        validate_branch_name(name)
        with _translate(f"branch {self._where(name)}"):
            try:
                self._repo().branch(name).head  # noqa: B018 - GET /branches/{id}
            except lakefs_exc.NotFoundException:
                return False
            return True

    def resolve_ref(self, ref: str) -> str:
        """See ``VersionedLake.resolve_ref``; a malformed ref (400) is reported as not found."""
        with _translate(f"resolve {self._where(ref)}"):
            try:
                return self._repo().ref(ref).get_commit().id
            except lakefs_exc.BadRequestException as exc:
                raise NotFoundError(f"ref {ref!r} not found: {_message(exc)}") from exc

    # ============================================================================ objects
    def put_object(self, branch: str, key: str, data: bytes) -> ObjectStat:
        """See ``VersionedLake.put_object``."""
        validate_branch_name(branch)
        validate_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_object needs bytes, got {type(data).__name__}")
        obj = self._repo().branch(branch).object(key)
        with _translate(f"put {self._where(branch, key)}"):
            if self._via_gateway():
                self.gateway().put(self.repository, f"{branch}/{key}", bytes(data))
            else:
                obj.upload(bytes(data), mode="wb")
            info = obj.stat()  # lakeFS's checksum, so put and stat_object always agree
        return ObjectStat(key=key, size=int(info.size_bytes or len(data)), checksum=info.checksum)

    # ---------------------------------------------------------------- resumable uploads
    # Always through the S3 gateway (lakeFS has no multipart on its REST API), whatever
    # ``object_io`` says for whole objects.
    @property
    def min_part_bytes(self) -> int:
        return S3_MIN_PART_BYTES

    def begin_upload(self, branch: str, key: str) -> UploadHandle:
        """See ``VersionedLake.begin_upload``."""
        validate_branch_name(branch)
        validate_key(key)
        self.resolve_ref(branch)  # a missing branch is NotFoundError before anything opens
        upload_id = self.gateway().create_upload(self.repository, f"{branch}/{key}")
        return UploadHandle(branch=branch, key=key, upload_id=upload_id)

    def upload_part(self, upload: UploadHandle, part_number: int, data: bytes) -> str:
        where = f"{upload.branch}/{upload.key}"
        return self.gateway().upload_part(
            self.repository, where, upload.upload_id, int(part_number), bytes(data)
        )

    def uploaded_parts(self, upload: UploadHandle) -> dict[int, str]:
        where = f"{upload.branch}/{upload.key}"
        return self.gateway().list_parts(self.repository, where, upload.upload_id)

    def complete_upload(self, upload: UploadHandle, parts: dict[int, str]) -> ObjectStat:
        where = f"{upload.branch}/{upload.key}"
        self.gateway().complete_upload(self.repository, where, upload.upload_id, dict(parts))
        return self.stat_object(upload.branch, upload.key)

    def abort_upload(self, upload: UploadHandle) -> None:
        where = f"{upload.branch}/{upload.key}"
        try:
            self.gateway().abort_upload(self.repository, where, upload.upload_id)
        except NotFoundError:
            return

    def get_object(self, ref: str, key: str) -> bytes:
        """See ``VersionedLake.get_object``."""
        validate_key(key)
        if self._via_gateway():
            with _translate(f"get {self._where(ref, key)}"):
                return self.gateway().get(self.repository, f"{ref}/{key}")
        obj = self._repo().ref(ref).object(key)
        with _translate(f"get {self._where(ref, key)}"), obj.reader(mode="rb") as reader:
            data = reader.read()
        return data if isinstance(data, bytes) else data.encode("utf-8")

    def download_object(
        self, ref: str, key: str, destination: str | os.PathLike[str]
    ) -> ObjectStat:
        """See ``VersionedLake.download_object``.

        Streams through the S3 gateway (``object_io="s3_gateway"``: one GET, resumed after a
        broken connection) or the API (ranged reads of ``API_READ_BYTES`` through the SDK's
        object reader). A branch's object can be replaced while it is read, so the object is
        stat-ed before and after: a different checksum, or a byte count other than the size,
        raises ``ConcurrentUpdateError`` and leaves no file. The checksum returned is lakeFS's,
        as ``stat_object`` reports it.
        """
        before = self.stat_object(ref, key)
        where = self._where(ref, key)
        with _translate(f"download {where}"), replacing_file(destination) as sink:
            if self._via_gateway():
                written, _etag = self.gateway().download(self.repository, f"{ref}/{key}", sink)
            else:
                written = self._read_ranges(ref, key, before.size, sink)
            after = self.stat_object(ref, key)
            if written != before.size or after.checksum != before.checksum:
                raise ConcurrentUpdateError(
                    f"download {where}: the object changed while it was read ({before.size} "
                    f"bytes with checksum {before.checksum} announced, {written} bytes read, "
                    f"checksum now {after.checksum}); download it again"
                )
        return before

    def _read_ranges(self, ref: str, key: str, size: int, sink: BinaryIO) -> int:
        """Copy the first ``size`` bytes of the object into ``sink``, one ranged read of at
        most ``API_READ_BYTES`` at a time; the number of bytes copied (less than ``size`` when
        the object shrank meanwhile)."""
        written = 0
        if size == 0:
            return 0  # a range on an empty object is unsatisfiable (416): nothing to read
        with self._repo().ref(ref).object(key).reader(mode="rb") as reader:
            while written < size:
                block = reader.read(min(API_READ_BYTES, size - written))
                if not block:
                    break
                sink.write(block)
                written += len(block)
        return written

    def _upload_file_part_bytes(self, size: int) -> int:
        """Parts of ``multipart_part_mb`` (the gateway's configured part size), or larger when
        the file would otherwise need more than S3's 10,000 parts."""
        return max(super()._upload_file_part_bytes(size), self.multipart_part_mb * _MIB)

    def stat_object(self, ref: str, key: str) -> ObjectStat:
        """See ``VersionedLake.stat_object``."""
        validate_key(key)
        with _translate(f"stat {self._where(ref, key)}"):
            info = self._repo().ref(ref).object(key).stat()
        return ObjectStat(key=key, size=int(info.size_bytes or 0), checksum=info.checksum)

    def object_exists(self, ref: str, key: str) -> bool:
        """See ``VersionedLake.object_exists``; a missing ref raises ``NotFoundError``."""
        validate_key(key)
        with _translate(f"exists {self._where(ref, key)}"):
            if self._repo().ref(ref).object(key).exists():
                return True
        self.resolve_ref(ref)  # 404 on HEAD is ambiguous: tell a missing ref from a missing key
        return False

    def list_objects(self, ref: str, prefix: str = "") -> list[ObjectStat]:
        """See ``VersionedLake.list_objects``."""
        validate_prefix(prefix)
        with _translate(f"list {self._where(ref, prefix)}"):
            items = list(self._repo().ref(ref).objects(prefix=prefix or None))
        stats = [
            ObjectStat(key=i.path, size=int(i.size_bytes or 0), checksum=i.checksum)
            for i in items
            if isinstance(i, ObjectInfo)
        ]
        return sorted(stats, key=lambda s: s.key)

    def delete_object(self, branch: str, key: str) -> None:
        """See ``VersionedLake.delete_object``."""
        validate_branch_name(branch)
        validate_key(key)
        obj = self._repo().branch(branch).object(key)
        with _translate(f"delete {self._where(branch, key)}"):
            # lakeFS may answer 204 for an absent key; the port promises NotFoundError.
            if not obj.exists():
                raise NotFoundError(f"object {key!r} not found on branch {branch!r}")
            obj.delete()

    def uncommitted(self, branch: str) -> list[DiffEntry]:
        """See ``VersionedLake.uncommitted``."""
        validate_branch_name(branch)
        with _translate(f"uncommitted changes of {self._where(branch)}"):
            return _diff_entries(self._repo().branch(branch).uncommitted())

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
        with _translate(f"commit on {self._where(branch)}"):
            try:
                ref = (
                    self._repo()
                    .branch(branch)
                    .commit(message=message, metadata=meta or None, allow_empty=allow_empty)
                )
            except lakefs_exc.BadRequestException as exc:
                if "no changes" in _message(exc).lower():
                    raise NothingToCommitError(
                        f"nothing to commit on branch {branch!r}: no staged changes"
                    ) from exc
                raise
            except lakefs_exc.ServerException as exc:
                text = _message(exc).lower()
                # lakeFS reports exhausted branch-lock retries as 423/429 "too many attempts".
                if _status(exc) in (409, 423, 429) or "locked" in text or "not head" in text:
                    raise ConcurrentUpdateError(
                        f"commit on {branch!r} raced another writer: {_message(exc)}"
                    ) from exc
                raise
            return ref.id

    def log(
        self, ref: str, limit: int | None = None, stop_at: str | None = None
    ) -> list[CommitInfo]:
        """See ``VersionedLake.log``. ``stop_at`` is applied client-side so its exclusivity
        does not depend on the server version."""
        if limit is not None and limit < 0:
            raise LakeError(f"log limit must be >= 0, got {limit}")
        if limit == 0:
            return []
        out: list[CommitInfo] = []
        with _translate(f"log of {self._where(ref)}"):
            for commit in self._repo().ref(ref).log():
                if stop_at is not None and commit.id == stop_at:
                    break
                out.append(_commit_info(commit))
                if limit is not None and len(out) >= limit:
                    break
        return out

    def diff(
        self, left_ref: str, right_ref: str, prefix: str = "", three_dot: bool = False
    ) -> list[DiffEntry]:
        """See ``VersionedLake.diff``."""
        validate_prefix(prefix)
        left = self.resolve_ref(left_ref)
        right = self.resolve_ref(right_ref)
        kind = "three_dot" if three_dot else "two_dot"
        with _translate(f"diff {left_ref!r}..{right_ref!r}"):
            changes = self._repo().ref(left).diff(right, prefix=prefix or None, type=kind)
            return _diff_entries(changes)

    def _conflicting_keys(self, base: str, source: str, destination: str) -> list[str]:
        """Keys both sides changed since ``base`` to different results (lakeFS's 409 body does
        not list them)."""
        from_source = {e.key: e for e in self.diff(base, source)}
        from_dest = {e.key: e for e in self.diff(base, destination)}
        conflicts: list[str] = []
        for key in sorted(from_source.keys() & from_dest.keys()):
            removed_src = from_source[key].type == "removed"
            removed_dst = from_dest[key].type == "removed"
            if removed_src and removed_dst:
                continue
            if removed_src != removed_dst:
                conflicts.append(key)
                continue
            if (
                self.stat_object(source, key).checksum
                != self.stat_object(destination, key).checksum
            ):
                conflicts.append(key)
        return conflicts

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
        if self.uncommitted(destination_branch):
            raise LakeError(
                f"cannot merge into {destination_branch!r}: it has uncommitted changes; "
                "commit or discard them first"
            )
        source = self.resolve_ref(source_ref)
        refs_api = self.client.sdk_client.refs_api
        with _translate(f"merge {source_ref!r} into {destination_branch!r}"):
            with api_exception_handler():
                found = refs_api.find_merge_base(self.repository, source, destination_branch)
            if found.base_commit_id == found.source_commit_id:
                return found.destination_commit_id  # already merged
            options: dict[str, Any] = {
                "message": message or f"Merge '{source_ref}' into '{destination_branch}'",
                "allow_empty": True,  # the port always records a merge commit
            }
            if meta:
                options["metadata"] = meta
            try:
                return self._repo().ref(source).merge_into(destination_branch, **options)
            except lakefs_exc.ConflictException as exc:
                conflicts = self._conflicting_keys(
                    found.base_commit_id, source, found.destination_commit_id
                )
                if not conflicts:  # a 409 without conflicting keys is a race, not a conflict
                    raise ConcurrentUpdateError(
                        f"merge of {source_ref!r} into {destination_branch!r} raced another "
                        f"writer: {_message(exc)}"
                    ) from exc
                raise MergeConflictError(conflicts, source_ref, destination_branch) from exc
            except lakefs_exc.ServerException as exc:
                if _status(exc) in (423, 429):
                    raise ConcurrentUpdateError(
                        f"merge into {destination_branch!r} gave up on the branch lock: "
                        f"{_message(exc)}"
                    ) from exc
                raise

    # ============================================================================ tags
    def create_tag(self, tag: str, ref: str) -> str:
        """See ``VersionedLake.create_tag``; the ref is resolved first, so the tag is pinned to
        the commit id we return even if a branch moves meanwhile."""
        validate_tag_name(tag)
        commit_id = self.resolve_ref(ref)
        with _translate(f"create tag {tag!r} at {ref!r}"):
            try:
                self._repo().tag(tag).create(commit_id)
            except lakefs_exc.ConflictException as exc:
                raise TagExistsError(f"tag {tag!r} already exists") from exc
        return commit_id

    def list_tags(self) -> dict[str, str]:
        """See ``VersionedLake.list_tags``."""
        api = self.client.sdk_client.tags_api
        with _translate(f"list tags of {self.repository!r}"):
            refs = list(generate_listing(api.list_tags, self.repository))
        return {r.id: r.commit_id for r in sorted(refs, key=lambda r: r.id)}

    def delete_tag(self, tag: str) -> None:
        """See ``VersionedLake.delete_tag``."""
        validate_tag_name(tag)
        with _translate(f"delete tag {tag!r}"):
            self._repo().tag(tag).delete()
