"""The S3 object path (``S3Gateway``) against moto's S3 in server mode, over real HTTP.

lakeFS's gateway is S3 with bucket = repository and key = ``<ref>/<path>``; moto stands in for
it here (no lakeFS binary on CI). A fault-injecting proxy in front of moto checks the retry
rules on the wire: 5xx is retried (a multipart part on its own), 4xx is not, and a multipart
upload that cannot finish is aborted instead of leaving parts behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

from aiinfra_pipelines.lake import (
    ConcurrentUpdateError,
    LakeAuthError,
    LakeFSLake,
    LakeUnavailableError,
    NotFoundError,
)
from aiinfra_pipelines.lake.retry import RetryPolicy
from aiinfra_pipelines.lake.s3_gateway import MIB, S3Gateway, TransferSettings
from aiinfra_pipelines_tests.support.http_fakes import (
    FakeLakeFS,
    FaultyProxy,
    Reply,
    commit_json,
    moto_s3,
    serve,
)

KEY_ID, SECRET = "AKIA-GATEWAY-TESTS", "gateway-secret-never-logged"
FAST_RETRIES = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)
SMALL_PARTS = TransferSettings(
    multipart_threshold_bytes=5 * MIB, part_size_bytes=5 * MIB, max_concurrency=3
)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_s3() as url:
        yield url


@pytest.fixture
def bucket(moto_url: str, request: pytest.FixtureRequest) -> str:
    name = f"repo-{abs(hash(request.node.name)) % 10**8}"
    _raw(moto_url).create_bucket(Bucket=name)
    return name


def _raw(url: str):
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def _gateway(url: str, **kwargs) -> S3Gateway:
    return S3Gateway(url, KEY_ID, SECRET, policy=FAST_RETRIES, **kwargs)


@pytest.mark.services  # moto's S3 server
def test_objects_round_trip_with_lakefs_key_layout(moto_url: str, bucket: str) -> None:
    gateway = _gateway(moto_url)
    etag = gateway.put(bucket, "main/logs/a.mcap", b"aaaa")
    gateway.put(bucket, "main/logs/b.mcap", b"b" * 10)
    gateway.put(bucket, "ingest-1/logs/c.mcap", b"")
    assert etag == hashlib.md5(b"aaaa").hexdigest()
    assert gateway.get(bucket, "main/logs/a.mcap") == b"aaaa"
    assert gateway.get(bucket, "ingest-1/logs/c.mcap") == b""
    assert gateway.head(bucket, "main/logs/b.mcap") == (10, hashlib.md5(b"b" * 10).hexdigest())
    assert [key for key, _, _ in gateway.list(bucket, "main/")] == [
        "main/logs/a.mcap",
        "main/logs/b.mcap",
    ]
    gateway.delete(bucket, "main/logs/a.mcap")
    with pytest.raises(NotFoundError, match=r"main/logs/a\.mcap"):
        gateway.get(bucket, "main/logs/a.mcap")
    with pytest.raises(NotFoundError):
        gateway.get("no-such-repository", "main/x")
    assert SECRET not in repr(gateway) and SECRET not in repr(vars(gateway))


@pytest.mark.services  # moto's S3 server
def test_listing_follows_pagination(moto_url: str, bucket: str) -> None:
    gateway = _gateway(moto_url)
    for index in range(7):
        gateway.put(bucket, f"main/k/{index:02d}", b"x")
    gateway.put(bucket, "main/other", b"y")
    keys = [key for key, _, _ in gateway.list(bucket, "main/k/", page_size=2)]
    assert keys == [f"main/k/{index:02d}" for index in range(7)]


@pytest.mark.services  # moto's S3 server
def test_large_objects_go_multipart_and_come_back_intact(moto_url: str, bucket: str) -> None:
    data = os.urandom(11 * MIB + 123)  # 3 parts of 5 MiB, 5 MiB, 1 MiB + 123 B
    etag = _gateway(moto_url, transfer=SMALL_PARTS).put(bucket, "main/big.bin", data)
    assert etag.endswith("-3"), f"a multipart ETag names its part count: {etag}"
    assert hashlib.sha256(_gateway(moto_url).get(bucket, "main/big.bin")).digest() == (
        hashlib.sha256(data).digest()
    )


@pytest.mark.services  # moto's S3 server
def test_a_resumable_upload_survives_its_uploader(moto_url: str, bucket: str) -> None:
    """What a car's outbox does: open, send some parts, die; a new process lists what arrived
    and sends only the rest."""
    data = os.urandom(10 * MIB + 77)
    parts = [data[: 5 * MIB], data[5 * MIB : 10 * MIB], data[10 * MIB :]]
    first = _gateway(moto_url)
    upload_id = first.create_upload(bucket, "ingest-1/logs/a.mcap")
    sent = {1: first.upload_part(bucket, "ingest-1/logs/a.mcap", upload_id, 1, parts[0])}
    # ... the process dies here; a new one resumes by the persisted upload id.
    second = _gateway(moto_url)
    arrived = second.list_parts(bucket, "ingest-1/logs/a.mcap", upload_id)
    assert arrived == sent
    assert "Contents" not in _raw(moto_url).list_objects_v2(Bucket=bucket, Prefix="ingest-1/")
    for number in (2, 3):
        arrived[number] = second.upload_part(
            bucket, "ingest-1/logs/a.mcap", upload_id, number, parts[number - 1]
        )
    second.complete_upload(bucket, "ingest-1/logs/a.mcap", upload_id, arrived)
    assert second.get(bucket, "ingest-1/logs/a.mcap") == data
    with pytest.raises(NotFoundError):  # completed: the upload id is gone
        second.list_parts(bucket, "ingest-1/logs/a.mcap", upload_id)


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultyProxy]:
    faulty = FaultyProxy(moto_url)
    with serve(faulty):
        yield faulty


@pytest.mark.services  # moto's S3 server
def test_5xx_is_retried_and_4xx_is_not(proxy: FaultyProxy, moto_url: str, bucket: str) -> None:
    gateway = _gateway(proxy.url)
    proxy.fail("PUT", 503, 500)
    gateway.put(bucket, "main/retried.json", b"{}")
    assert proxy.count("PUT") == 3
    assert _raw(moto_url).get_object(Bucket=bucket, Key="main/retried.json")["Body"].read() == (
        b"{}"
    )

    proxy.fail("GET", 403)
    with pytest.raises(LakeAuthError, match="AccessDenied") as caught:
        gateway.get(bucket, "main/retried.json")
    assert SECRET not in str(caught.value)
    proxy.fail("GET", 404)
    with pytest.raises(NotFoundError):
        gateway.get(bucket, "main/retried.json")
    assert proxy.count("GET") == 2, "neither 403 nor 404 is retried"

    proxy.fail("GET", 503, 503, 503, 503)
    with pytest.raises(LakeUnavailableError, match=r"503.*4 attempt"):
        gateway.get(bucket, "main/retried.json")
    assert proxy.count("GET") == 6


@pytest.mark.services  # moto's S3 server
def test_a_failing_part_is_retried_alone(proxy: FaultyProxy, bucket: str) -> None:
    data = os.urandom(10 * MIB + 1)  # 3 parts
    proxy.fail("PUT", 503)  # the first part upload to arrive fails once
    _gateway(proxy.url, transfer=SMALL_PARTS).put(bucket, "main/parts.bin", data)
    assert proxy.count("PUT") == 4, "3 parts + 1 retry, not a restart of the whole upload"
    assert _gateway(proxy.url).get(bucket, "main/parts.bin") == data


@pytest.mark.services  # moto's S3 server
def test_an_upload_that_cannot_finish_is_aborted(
    proxy: FaultyProxy, moto_url: str, bucket: str
) -> None:
    proxy.fail("PUT", *([500] * 20))
    with pytest.raises(LakeUnavailableError, match="upload part"):
        _gateway(proxy.url, transfer=SMALL_PARTS).put(bucket, "main/doomed.bin", bytes(6 * MIB))
    pending = _raw(moto_url).list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert pending == [], "no orphaned multipart upload is left in the bucket"
    assert "Contents" not in _raw(moto_url).list_objects_v2(Bucket=bucket, Prefix="main/doomed")


@pytest.mark.services  # moto's S3 server
def test_lakefs_lake_moves_object_bytes_through_the_gateway(moto_url: str) -> None:
    """``object_io: s3_gateway``: bytes go to bucket = repository, key = ``<ref>/<path>``; the
    lakeFS API is asked only for the stat (its checksum is what the port reports)."""
    _raw(moto_url).create_bucket(Bucket="drive-data")
    api = FakeLakeFS()
    stat = {
        "path": "logs/a.mcap",
        "path_type": "object",
        "physical_address": "s3://bucket/data/abc",
        "checksum": "lakefs-checksum",
        "size_bytes": 5,
        "mtime": 1_700_000_000,
    }
    api.route(
        "GET", "/api/v1/repositories/drive-data/refs/ingest-7/objects/stat", then=Reply(200, stat)
    )
    with serve(api):
        lake = LakeFSLake(
            endpoint=f"{api.url}/api/v1",
            access_key_id=KEY_ID,
            secret_access_key=SECRET,
            object_io="s3_gateway",
            s3_gateway_endpoint=moto_url,
            retry_initial_backoff_s=0.01,
            retry_max_backoff_s=0.05,
        )
        written = lake.put_object("ingest-7", "logs/a.mcap", b"hello")
        assert (written.size, written.checksum) == (5, "lakefs-checksum")
        stored = _raw(moto_url).get_object(Bucket="drive-data", Key="ingest-7/logs/a.mcap")
        assert stored["Body"].read() == b"hello"
        assert lake.get_object("ingest-7", "logs/a.mcap") == b"hello"
        with pytest.raises(NotFoundError):
            lake.get_object("ingest-7", "logs/missing.mcap")
    assert [m for m, _, _ in api.requests] == ["GET"], "bytes never went through the API"


def test_the_gateway_endpoint_defaults_to_the_api_host() -> None:
    lake = LakeFSLake(
        endpoint="https://lakefs.example:8000/api/v1",
        access_key_id="k",
        secret_access_key="s",
        object_io="s3_gateway",
    )
    assert lake.gateway().endpoint_url == "https://lakefs.example:8000"
    with pytest.raises(ValueError, match="5 MiB"):
        TransferSettings(part_size_bytes=MIB)


# ------------------------------------------------------------------------ streamed downloads
class _BreakingProxy:
    """Forwards to ``upstream`` (moto), recording each GET's ``Range``; the first GET's body is
    cut off halfway (the headers promise all of it), as a dropped connection does.
    ``before_resume`` runs before the second GET is forwarded."""

    def __init__(self, upstream: str, before_resume: Callable[[], None] = lambda: None) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.before_resume = before_resume
        self.ranges: list[str | None] = []
        self._lock = threading.Lock()
        self.url = ""

    def _answer(self, handler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            if handler.command == "GET":
                self.ranges.append(handler.headers.get("Range"))
            gets = len(self.ranges) if handler.command == "GET" else 0
        if gets == 2:
            self.before_resume()
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
        connection.request(handler.command, handler.path, body=body, headers=headers)
        answer = connection.getresponse()
        payload = answer.read()
        connection.close()
        handler.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if handler.command == "HEAD":
            return
        if gets == 1:
            handler.close_connection = True
            # the client may already have given up on this connection
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                handler.wfile.write(payload[: len(payload) // 2])
            return
        handler.wfile.write(payload)


@pytest.mark.services  # moto's S3 server
def test_download_streams_into_a_file_and_resumes_a_broken_body(
    moto_url: str, bucket: str, tmp_path: Path
) -> None:
    data = os.urandom(3 * MIB + 17)
    _raw(moto_url).put_object(Bucket=bucket, Key="main/log.mcap", Body=data)
    _raw(moto_url).put_object(Bucket=bucket, Key="main/empty.bin", Body=b"")
    proxy = _BreakingProxy(moto_url)
    with serve(proxy), (tmp_path / "log.mcap").open("wb") as sink:
        size, etag = _gateway(proxy.url).download(bucket, "main/log.mcap", sink, block_bytes=MIB)
    assert (size, etag) == (len(data), hashlib.md5(data).hexdigest())
    assert (tmp_path / "log.mcap").read_bytes() == data
    half = len(data) // 2
    assert proxy.ranges == [None, f"bytes={half}-"], "the retry resumes, it does not restart"

    whole = _BreakingProxy(moto_url)
    with serve(whole):
        assert _gateway(whole.url).get(bucket, "main/log.mcap") == data
    assert whole.ranges == [None, None], "get() retries a broken body (from the start)"

    with (tmp_path / "empty.bin").open("wb") as sink:
        assert _gateway(moto_url).download(bucket, "main/empty.bin", sink) == (
            0,
            hashlib.md5(b"").hexdigest(),
        )
    with (tmp_path / "missing.bin").open("wb") as sink, pytest.raises(NotFoundError):
        _gateway(moto_url).download(bucket, "main/missing.bin", sink)


@pytest.mark.services  # moto's S3 server
def test_a_resumed_download_refuses_an_object_replaced_meanwhile(
    moto_url: str, bucket: str, tmp_path: Path
) -> None:
    _raw(moto_url).put_object(Bucket=bucket, Key="main/log.mcap", Body=b"a" * MIB)

    def replace() -> None:
        _raw(moto_url).put_object(Bucket=bucket, Key="main/log.mcap", Body=b"b" * MIB)

    proxy = _BreakingProxy(moto_url, before_resume=replace)
    with (
        serve(proxy),
        (tmp_path / "log.mcap").open("wb") as sink,
        pytest.raises(ConcurrentUpdateError, match="changed meanwhile"),
    ):
        _gateway(proxy.url).download(bucket, "main/log.mcap", sink)
    assert len(proxy.ranges) == 2, "If-Match made the server refuse the other version's bytes"


@pytest.mark.services  # moto's S3 server
def test_lakefs_lake_moves_files_through_the_gateway(moto_url: str, tmp_path: Path) -> None:
    """``upload_file`` larger than one part goes up as a multipart upload through the gateway,
    ``download_object`` comes back through a streamed GET; the API is asked only for the
    branch (before the upload opens) and the stats."""
    _raw(moto_url).create_bucket(Bucket="drive-data")
    data = os.urandom(11 * MIB + 5)  # parts of 5, 5 and 1 MiB
    source = tmp_path / "drive.mcap"
    source.write_bytes(data)
    api = FakeLakeFS()
    repo = "/api/v1/repositories/drive-data"
    api.route("GET", f"{repo}/commits/ingest-7", then=Reply(200, commit_json("c-7")))
    stat = {
        "path": "logs/drive.mcap",
        "path_type": "object",
        "physical_address": "s3://bucket/data/abc",
        "checksum": "lakefs-checksum",
        "size_bytes": len(data),
        "mtime": 1_700_000_000,
    }
    api.route("GET", f"{repo}/refs/ingest-7/objects/stat", then=Reply(200, stat))
    with serve(api):
        lake = LakeFSLake(
            endpoint=f"{api.url}/api/v1",
            access_key_id=KEY_ID,
            secret_access_key=SECRET,
            object_io="s3_gateway",
            s3_gateway_endpoint=moto_url,
            multipart_part_mb=5,
            multipart_threshold_mb=5,
            retry_initial_backoff_s=0.01,
            retry_max_backoff_s=0.05,
        )
        written = lake.upload_file("ingest-7", "logs/drive.mcap", source)
        assert (written.size, written.checksum) == (len(data), "lakefs-checksum")
        stored = _raw(moto_url).head_object(Bucket="drive-data", Key="ingest-7/logs/drive.mcap")
        assert stored["ETag"].strip('"').endswith("-3"), "three parts"
        downloaded = lake.download_object("ingest-7", "logs/drive.mcap", tmp_path / "back.mcap")
        assert downloaded == written
        assert (tmp_path / "back.mcap").read_bytes() == data
        with pytest.raises(NotFoundError):
            lake.upload_file("no-such-branch", "logs/drive.mcap", source)
    assert {(m, p) for m, p, _ in api.requests} == {
        ("GET", f"{repo}/commits/ingest-7"),
        ("GET", f"{repo}/commits/no-such-branch"),
        ("GET", f"{repo}/refs/ingest-7/objects/stat"),
    }, "bytes never went through the API"
    pending = _raw(moto_url).list_multipart_uploads(Bucket="drive-data").get("Uploads", [])
    assert pending == []
