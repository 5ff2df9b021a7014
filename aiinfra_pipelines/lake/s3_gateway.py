"""Bulk object bytes over an S3 API — in production, lakeFS's S3 gateway.

lakeFS serves an S3-compatible endpoint beside its REST API: the *bucket* is the repository
and the *key* is ``<ref>/<path>`` (a branch to write, any branch, tag or commit id to read).
Object bytes take that path because it is what S3 tooling is built for: streaming without
the API server's multipart-form round trip, multipart uploads for large objects (parts sent
in parallel, each retried on its own), and the same client code against AWS S3, MinIO or moto
in tests. Versioning (commits, merges, tags, diffs) stays on the lakeFS API.

Client settings that matter for lakeFS (and any non-AWS S3):

* path-style addressing (``endpoint/bucket/key``): virtual-host style needs wildcard DNS;
* ``request_checksum_calculation``/``response_checksum_validation`` = ``when_required``: since
  botocore 1.36 the SDK otherwise adds CRC32 trailers that lakeFS's gateway does not accept
  (lakeFS's documented boto3 workaround);
* botocore's own retries are off (``total_max_attempts=1``): every request goes through
  ``aiinfra_pipelines.lake.retry`` so the policy and logging are the lakeFS API's.

Failures arrive as ``aiinfra_pipelines.lake.errors``: 404 → ``NotFoundError``, 401/403 →
``LakeAuthError``, 412 (a conditional read found another version) → ``ConcurrentUpdateError``,
other 4xx → ``LakeError``, exhausted 5xx/timeouts/connection errors → ``LakeUnavailableError``.
The secret key lives only inside the botocore client; it is in no attribute, ``repr`` or
message of this class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from aiinfra_pipelines.lake.errors import (
    ConcurrentUpdateError,
    LakeAuthError,
    LakeError,
    LakeUnavailableError,
    NotFoundError,
)
from aiinfra_pipelines.lake.files import BLOCK_BYTES
from aiinfra_pipelines.lake.retry import (
    IDEMPOTENT_METHODS,
    RetryPolicy,
    attempts_made,
    call_with_retries,
    status_is_retryable,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
# S3's floor for every part but the last; lakeFS's gateway enforces the same rule.
MIN_PART_BYTES = 5 * MIB
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "404"})
_AUTH_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "Forbidden"}
)


@dataclass(frozen=True)
class TransferSettings:
    """Multipart and timeout settings (from the environment's ``lake:`` configuration)."""

    multipart_threshold_bytes: int = 64 * MIB
    part_size_bytes: int = 16 * MIB
    max_concurrency: int = 4
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.part_size_bytes < MIN_PART_BYTES:
            raise ValueError(
                f"multipart part size {self.part_size_bytes} B is below S3's minimum "
                f"{MIN_PART_BYTES} B (5 MiB)"
            )
        if self.multipart_threshold_bytes < self.part_size_bytes:
            raise ValueError("multipart threshold must be at least one part size")
        if self.max_concurrency < 1:
            raise ValueError("multipart max_concurrency must be >= 1")


def _status(exc: ClientError) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _retryable(method: str) -> Callable[[BaseException], bool]:
    idempotent = method in IDEMPOTENT_METHODS

    def retryable(exc: BaseException) -> bool:
        if isinstance(exc, ClientError):
            return status_is_retryable(_status(exc), method)
        if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
            return True  # never reached the server
        if isinstance(
            exc,
            ReadTimeoutError | ConnectionClosedError | ResponseStreamingError | IncompleteReadError,
        ):
            return idempotent
        return False

    return retryable


def _retry_after(exc: BaseException) -> float | None:
    if isinstance(exc, ClientError):
        headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        try:
            return float(headers["retry-after"]) if "retry-after" in headers else None
        except ValueError:
            return None
    return None


def translate(what: str, exc: BaseException) -> LakeError:
    """The lake error for an S3 client failure (after retries)."""
    attempts = attempts_made(exc)
    after = f" after {attempts} attempt(s)" if attempts else ""
    if isinstance(exc, ClientError):
        status, code = _status(exc), _code(exc)
        message = exc.response.get("Error", {}).get("Message", "") or code
        if status == 404 or code in _NOT_FOUND_CODES:
            return NotFoundError(f"{what}: not found ({code or status})")
        if status in (401, 403) or code in _AUTH_CODES:
            return LakeAuthError(f"{what}: access denied ({code or status}): {message}")
        if status == 412:
            return ConcurrentUpdateError(f"{what}: the object changed meanwhile ({code}) {message}")
        if status is not None and status >= 500:
            return LakeUnavailableError(f"{what}: HTTP {status} {code}{after}: {message}")
        return LakeError(f"{what}: HTTP {status} {code}: {message}")
    return LakeUnavailableError(f"{what}: {type(exc).__name__}{after}: {exc}")


class S3Gateway:
    """Object get/put/head/list/delete on one S3-compatible endpoint, with retries.

    The boto3 client is thread-safe (multipart parts share it).
    """

    def __init__(
        self,
        endpoint_url: str,
        access_key_id: str,
        secret_access_key: str,
        *,
        region: str = "us-east-1",
        policy: RetryPolicy | None = None,
        transfer: TransferSettings | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url.rstrip("/")
        self.region = region
        self.policy = policy or RetryPolicy()
        self.transfer = transfer or TransferSettings()
        # Built here (no network I/O) so the secret is held by botocore's credentials alone.
        self.client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            region_name=region,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=self.transfer.connect_timeout_s,
                read_timeout=self.transfer.read_timeout_s,
                max_pool_connections=max(10, self.transfer.max_concurrency * 2),
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def __repr__(self) -> str:
        return f"S3Gateway(endpoint_url={self.endpoint_url!r}, region={self.region!r})"

    # ------------------------------------------------------------------------------ plumbing
    def _call(self, what: str, method: str, attempt: Callable[[], T]) -> T:
        try:
            return call_with_retries(
                f"S3 {what}",
                attempt,
                self.policy,
                retryable=_retryable(method),
                retry_after=_retry_after,
            )
        except (ClientError, BotoCoreError) as exc:
            raise translate(what, exc) from exc

    @staticmethod
    def _where(bucket: str, key: str) -> str:
        return f"s3://{bucket}/{key}"

    # ------------------------------------------------------------------------------ objects
    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Store ``data`` at ``key`` (multipart above the threshold); returns the ETag."""
        if len(data) >= self.transfer.multipart_threshold_bytes:
            return self._put_multipart(bucket, key, data)
        what = f"put {self._where(bucket, key)}"
        response = self._call(
            what, "PUT", lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data)
        )
        return str(response.get("ETag", "")).strip('"')

    def get(self, bucket: str, key: str) -> bytes:
        """The bytes at ``key``; a truncated body is retried like a dropped connection."""

        def attempt() -> bytes:
            response = self.client.get_object(Bucket=bucket, Key=key)
            # botocore's StreamingBody.read (not the raw stream ``with`` would hand out) turns a
            # broken body into a retryable botocore error and checks the Content-Length.
            with closing(response["Body"]) as body:
                return body.read()

        return self._call(f"get {self._where(bucket, key)}", "GET", attempt)

    def download(
        self, bucket: str, key: str, sink: BinaryIO, block_bytes: int = BLOCK_BYTES
    ) -> tuple[int, str]:
        """Stream the object at ``key`` into ``sink`` ``block_bytes`` at a time; ``(size, etag)``.

        ``sink`` is a seekable file positioned where the content goes (a fresh file). A GET
        whose body breaks off is retried like one that failed outright and resumes where it
        stopped, with ``Range`` and ``If-Match`` on the first answer's ETag, so a multi-GB
        object is not fetched again from the start and both halves come from one version (a
        replaced object fails with ``ConcurrentUpdateError``). A server that ignores the
        ``Range`` is read again from the start.
        """
        start = sink.tell()
        written = 0
        etag: str | None = None

        def attempt() -> tuple[int, str]:
            nonlocal written, etag
            request: dict[str, Any] = {"Bucket": bucket, "Key": key}
            if written:
                request["Range"] = f"bytes={written}-"
                if etag:
                    request["IfMatch"] = f'"{etag}"'
            response = self.client.get_object(**request)
            answered = str(response.get("ETag", "")).strip('"')
            offset = written
            if offset and not str(response.get("ContentRange", "")).startswith(f"bytes {offset}-"):
                offset = 0  # the whole object came back
            if offset and etag and answered != etag:
                raise ConcurrentUpdateError(
                    f"get {self._where(bucket, key)}: replaced while it was read "
                    f"(ETag {etag} became {answered})"
                )
            sink.seek(start + offset)
            sink.truncate()
            written, etag = offset, answered
            # closing(), not ``with``: a StreamingBody's __enter__ returns the raw urllib3
            # stream, and its own read() is the one that checks the Content-Length at the end.
            with closing(response["Body"]) as body:
                for block in body.iter_chunks(block_bytes):
                    sink.write(block)
                    written += len(block)
            return written, answered

        return self._call(f"get {self._where(bucket, key)}", "GET", attempt)

    def head(self, bucket: str, key: str) -> tuple[int, str]:
        """``(size, etag)`` of ``key``."""
        response = self._call(
            f"head {self._where(bucket, key)}",
            "HEAD",
            lambda: self.client.head_object(Bucket=bucket, Key=key),
        )
        return int(response["ContentLength"]), str(response.get("ETag", "")).strip('"')

    def list(
        self, bucket: str, prefix: str = "", page_size: int = 1000
    ) -> list[tuple[str, int, str]]:
        """``(key, size, etag)`` of every key under ``prefix``, following pagination (each page
        is its own retried request)."""
        out: list[tuple[str, int, str]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(
                f"list {self._where(bucket, prefix)}",
                "GET",
                lambda kwargs=kwargs: self.client.list_objects_v2(**kwargs),
            )
            out.extend(
                (item["Key"], int(item["Size"]), str(item.get("ETag", "")).strip('"'))
                for item in page.get("Contents", [])
            )
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def delete(self, bucket: str, key: str) -> None:
        self._call(
            f"delete {self._where(bucket, key)}",
            "DELETE",
            lambda: self.client.delete_object(Bucket=bucket, Key=key),
        )

    # ----------------------------------------------------------------------------- multipart
    def create_upload(self, bucket: str, key: str) -> str:
        """Open a multipart upload; its UploadId."""
        return self._call(
            f"create multipart upload {self._where(bucket, key)}",
            "POST",
            lambda: self.client.create_multipart_upload(Bucket=bucket, Key=key),
        )["UploadId"]

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Send one part (a PUT: retried alone, re-sending replaces it); its ETag."""
        response = self._call(
            f"upload part {number} of {self._where(bucket, key)}",
            "PUT",
            lambda: self.client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        return str(response["ETag"]).strip('"')

    def list_parts(self, bucket: str, key: str, upload_id: str) -> dict[int, str]:
        """Part number → ETag of the parts that arrived (``NotFoundError``: no such upload)."""
        parts: dict[int, str] = {}
        marker = 0
        while True:
            page = self._call(
                f"list parts of {self._where(bucket, key)}",
                "GET",
                lambda marker=marker: self.client.list_parts(
                    Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker
                ),
            )
            for part in page.get("Parts", []):
                parts[int(part["PartNumber"])] = str(part["ETag"]).strip('"')
            if not page.get("IsTruncated"):
                return parts
            marker = int(page["NextPartNumberMarker"])

    def complete_upload(self, bucket: str, key: str, upload_id: str, parts: dict[int, str]) -> str:
        """Join the parts into the object; its ETag."""
        listed = [{"PartNumber": n, "ETag": f'"{parts[n]}"'} for n in sorted(parts)]
        response = self._call(
            f"complete multipart upload {self._where(bucket, key)}",
            "POST",
            lambda: self.client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": listed}
            ),
        )
        return str(response.get("ETag", "")).strip('"')

    def abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        self._call(
            f"abort multipart upload {self._where(bucket, key)}",
            "DELETE",
            lambda: self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id),
        )

    def _put_multipart(self, bucket: str, key: str, data: bytes) -> str:
        """Create → parts in parallel (each retried alone) → complete; abort on any failure so
        no orphaned parts accumulate in the bucket."""
        upload_id = self.create_upload(bucket, key)
        size = self.transfer.part_size_bytes
        view = memoryview(data)
        chunks = [
            (n + 1, view[offset : offset + size])
            for n, offset in enumerate(range(0, len(data), size))
        ]

        def send(part: tuple[int, memoryview]) -> tuple[int, str]:
            number, chunk = part
            return number, self.upload_part(bucket, key, upload_id, number, chunk.tobytes())

        try:
            with ThreadPoolExecutor(self.transfer.max_concurrency) as pool:
                parts = dict(pool.map(send, chunks))
            return self.complete_upload(bucket, key, upload_id, parts)
        except BaseException:
            try:
                self.abort_upload(bucket, key, upload_id)
            except LakeError as abort_error:  # the original failure is the one to report
                logger.warning(
                    "could not abort multipart upload of %s: %s",
                    self._where(bucket, key),
                    abort_error,
                )
            raise
