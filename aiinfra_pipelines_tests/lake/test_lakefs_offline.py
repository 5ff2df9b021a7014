"""LakeFSLake without a lakeFS server: the real SDK over HTTP against a scripted lakeFS API.

Every test drives the adapter and the ``lakefs`` SDK unchanged; only the server is scripted
(``support.http_fakes.FakeLakeFS`` answering with the JSON shapes of ``support.lakefs_api``).
So the adapter's own logic — diff orientation, error mapping, client-side ``stop_at``, merge
conflict naming, already-merged detection — runs end to end, and the tests assert the requests
it actually sent (path, query, body). The contract suite runs the same port against a real
server when ``LAKEFS_ENDPOINT`` is set.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from aiinfra_pipelines.lake import (
    ConcurrentUpdateError,
    LakeError,
    LakeFSLake,
    LakeUnavailableError,
    MergeConflictError,
    NotFoundError,
    NothingToCommitError,
)
from aiinfra_pipelines.lake import lakefs as lakefs_adapter
from aiinfra_pipelines_tests.support.http_fakes import (
    FakeLakeFS,
    Reply,
    commit_json,
    repository_json,
    serve,
)
from aiinfra_pipelines_tests.support.lakefs_api import (
    API,
    clean_branch,
    config_json,
    diff_json,
    error,
    listing,
    merge_base_json,
    object_stats_json,
    resolves,
    stat,
    two_dot_diff,
)


def _lake(url: str, **overrides) -> LakeFSLake:
    settings = {
        "repository": "drive-data",
        "endpoint": url,
        "access_key_id": "AKIA-TEST",
        "secret_access_key": "secret",
        "retry_max_attempts": 2,
        "retry_initial_backoff_s": 0.01,
        "retry_max_backoff_s": 0.02,
        "read_timeout_s": 30.0,  # the server answers at once; never retry on a busy runner
    }
    return LakeFSLake(**{**settings, **overrides})


def test_client_is_lazy_and_not_pickled(fake: FakeLakeFS) -> None:
    resolves(fake, "main", "c-main")
    lake = _lake(fake.url)
    assert lake._client is None
    assert lake.client.config.host.startswith(fake.url)
    assert fake.calls == [], "building the client contacts nothing"
    assert lake.resolve_ref("main") == "c-main"
    clone = pickle.loads(pickle.dumps(lake))
    assert clone._client is None
    assert clone.endpoint == lake.endpoint
    assert clone.resolve_ref("main") == "c-main", "the clone builds its own client"
    assert clone.client is not lake.client
    assert [c.path for c in fake.calls] == [f"{API}/commits/main"] * 2


def test_diff_resolves_refs_and_asks_for_two_dot(fake: FakeLakeFS) -> None:
    resolves(fake, "main", "c-main")
    resolves(fake, "feature", "c-feature")
    diff_path = f"{API}/refs/c-main/diff/c-feature"
    first_page = listing(
        [
            diff_json("z.txt", "removed", 3),
            diff_json("dir/", "prefix_changed", path_type="common_prefix"),
        ],
        next_offset="dir/",
    )
    fake.route(
        "GET",
        diff_path,
        Reply(200, first_page),
        then=Reply(200, listing([diff_json("a.txt", "added", 1)])),
        query={"type": "two_dot"},
    )
    fake.route("GET", diff_path, then=Reply(200, listing([])), query={"type": "three_dot"})

    entries = _lake(fake.url).diff("main", "feature", prefix="")
    assert [(e.key, e.type, e.size) for e in entries] == [
        ("a.txt", "added", 1),
        ("z.txt", "removed", 3),
    ], "objects only, sorted, across both pages"
    first, second = fake.calls_to("GET", diff_path)
    assert first.query == {"type": "two_dot"}, "both refs resolved to commits; no prefix"
    assert second.query == {"type": "two_dot", "after": "dir/"}, "the next page is fetched"

    assert _lake(fake.url).diff("main", "feature", prefix="dir/", three_dot=True) == []
    assert fake.calls_to("GET", diff_path)[-1].query == {"type": "three_dot", "prefix": "dir/"}


def test_commit_sends_message_and_metadata_and_maps_no_changes(fake: FakeLakeFS) -> None:
    fake.route("POST", f"{API}/branches/main/commits", then=error(400, "commit: no changes"))
    fake.route(
        "POST",
        f"{API}/branches/ingest-b1/commits",
        then=Reply(201, commit_json("c2", ["c1"])),
    )
    lake = _lake(fake.url)
    with pytest.raises(NothingToCommitError, match="main"):
        lake.commit("main", "nothing")
    assert lake.commit("ingest-b1", "land batch", metadata={"batch": "b1"}) == "c2"
    refused, landed = (c.json() for c in fake.calls_to("POST", f"{API}/branches/.*/commits"))
    assert refused["message"] == "nothing" and refused["allow_empty"] is False
    assert landed["message"] == "land batch" and landed["metadata"] == {"batch": "b1"}


def test_missing_object_maps_to_not_found(fake: FakeLakeFS) -> None:
    fake.route("GET", "/api/v1/config", then=Reply(200, config_json()))
    fake.route("GET", API, then=Reply(200, repository_json()))
    fake.route("GET", f"{API}/refs/main/objects", then=error(404, "path not found"))
    fake.route("GET", f"{API}/refs/main/objects/stat", then=error(404, "path not found"))
    lake = _lake(fake.url)
    with pytest.raises(NotFoundError, match=r"missing\.txt"):
        lake.get_object("main", "missing.txt")
    with pytest.raises(NotFoundError, match=r"gone\.txt"):
        lake.stat_object("main", "gone.txt")
    assert fake.calls_to("GET", f"{API}/refs/main/objects")[0].query["path"] == "missing.txt"
    assert fake.calls_to("GET", f"{API}/refs/main/objects/stat")[0].query["path"] == "gone.txt"


def test_raw_api_errors_are_translated(fake: FakeLakeFS) -> None:
    # lakeFS answers 410 "No data" when an object's bytes are gone from the object store.
    stat_path = f"{API}/refs/main/objects/stat"
    fake.route("GET", stat_path, then=error(410, "No data"), query={"path": "a.txt"})
    fake.route("GET", stat_path, then=error(500, "kv store down"), query={"path": "b.txt"})
    lake = _lake(fake.url)
    with pytest.raises(LakeError, match=r"stat lakefs://drive-data/main/a\.txt.*No data") as gone:
        lake.stat_object("main", "a.txt")
    assert not isinstance(gone.value, NotFoundError), "410 is not a missing key"
    with pytest.raises(LakeUnavailableError, match=r"HTTP 500 \(kv store down\) after 2"):
        lake.stat_object("main", "b.txt")
    assert [c.query["path"] for c in fake.calls_to("GET", stat_path)] == ["a.txt", "b.txt", "b.txt"]


def _history_commit(commit_id: str, parents: list[str]) -> dict:
    return {**commit_json(commit_id, parents), "metadata": {"k": commit_id}}


def test_log_applies_stop_at_and_limit_client_side(fake: FakeLakeFS) -> None:
    log_path = f"{API}/refs/main/commits"
    older = [_history_commit("c1", ["c0"]), _history_commit("c0", [])]
    newer = [_history_commit("c3", ["c2"]), _history_commit("c2", ["c1"])]
    fake.route("GET", log_path, then=Reply(200, listing(older)), query={"after": "c2"})
    fake.route("GET", log_path, then=Reply(200, listing(newer, next_offset="c2")))
    lake = _lake(fake.url)

    assert [c.id for c in lake.log("main", stop_at="c1")] == ["c3", "c2"]
    assert "stop_at" not in fake.calls_to("GET", log_path)[0].query, "applied client-side"
    assert [c.id for c in lake.log("main", limit=3)] == ["c3", "c2", "c1"]
    assert [c.id for c in lake.log("main")] == ["c3", "c2", "c1", "c0"]
    before = len(fake.calls_to("GET", log_path))
    newest = lake.log("main", limit=1)[0]
    assert len(fake.calls_to("GET", log_path)) == before + 1, "no second page for limit=1"
    assert newest.id == "c3" and newest.parents == ["c2"] and newest.metadata == {"k": "c3"}
    assert newest.created_at.year == 2023 and newest.created_at.tzinfo is not None


def _diverged_merge(fake: FakeLakeFS, merge_reply: Reply) -> None:
    """``relabel`` (c-relabel) and ``main`` (c-main) both moved on since c-base."""
    clean_branch(fake, "main")
    resolves(fake, "relabel", "c-relabel", ["c-base"])
    resolves(fake, "c-relabel", "c-relabel", ["c-base"])
    resolves(fake, "c-main", "c-main", ["c-base"])
    resolves(fake, "c-base", "c-base")
    fake.route(
        "GET",
        f"{API}/refs/c-relabel/merge/main",
        then=Reply(200, merge_base_json("c-relabel", "c-main", "c-base")),
    )
    fake.route("POST", f"{API}/refs/c-relabel/merge/main", then=merge_reply)


def test_merge_conflict_names_the_conflicting_keys(fake: FakeLakeFS) -> None:
    # lakeFS answers a conflict with 409 and a bare Error: the keys must be recomputed.
    _diverged_merge(fake, error(409, "conflict found"))
    two_dot_diff(
        fake,
        "c-base",
        "c-relabel",
        [
            diff_json("both-removed.json", "removed", 1),
            diff_json("changed.json", "changed", 2),
            diff_json("removed-here.json", "removed", 2),
            diff_json("same.json", "changed", 2),
            diff_json("source-only.json", "added", 2),
        ],
    )
    two_dot_diff(
        fake,
        "c-base",
        "c-main",
        [
            diff_json("both-removed.json", "removed", 1),
            diff_json("changed.json", "changed", 2),
            diff_json("removed-here.json", "changed", 2),
            diff_json("same.json", "changed", 2),
        ],
    )
    stat(fake, "c-relabel", "changed.json", "x")
    stat(fake, "c-main", "changed.json", "y")
    stat(fake, "c-relabel", "same.json", "s")
    stat(fake, "c-main", "same.json", "s")

    with pytest.raises(MergeConflictError) as caught:
        _lake(fake.url).merge("relabel", "main")
    assert caught.value.conflicts == ["changed.json", "removed-here.json"]
    (merge,) = fake.calls_to("POST", f"{API}/refs/c-relabel/merge/main")
    assert merge.json()["message"] == "Merge 'relabel' into 'main'"
    assert merge.json()["allow_empty"] is True
    stats = [(c.path, c.query["path"]) for c in fake.calls_to("GET", f"{API}/refs/.*/stat")]
    assert stats == [
        (f"{API}/refs/c-relabel/objects/stat", "changed.json"),
        (f"{API}/refs/c-main/objects/stat", "changed.json"),
        (f"{API}/refs/c-relabel/objects/stat", "same.json"),
        (f"{API}/refs/c-main/objects/stat", "same.json"),
    ], "contents compared at the commits the merge saw, not at moving branch heads"


def test_a_409_without_conflicting_keys_is_a_race(fake: FakeLakeFS) -> None:
    _diverged_merge(fake, error(409, "conflict found"))
    two_dot_diff(fake, "c-base", "c-relabel", [diff_json("a.json", "added", 1)])
    two_dot_diff(fake, "c-base", "c-main", [diff_json("b.json", "added", 1)])
    with pytest.raises(ConcurrentUpdateError, match="raced another writer"):
        _lake(fake.url).merge("relabel", "main")


def test_merge_records_a_merge_commit_with_metadata(fake: FakeLakeFS) -> None:
    _diverged_merge(fake, Reply(200, {"reference": "c-merge"}))
    assert _lake(fake.url).merge("relabel", "main", metadata={"run": "r1"}) == "c-merge"
    (merge,) = fake.calls_to("POST", f"{API}/refs/c-relabel/merge/main")
    assert merge.json()["metadata"] == {"run": "r1"}
    assert fake.calls_to("GET", f"{API}/refs/.*/diff/.*") == [], "no conflict, no diffs"


def test_merge_of_an_already_merged_source_returns_destination_head(fake: FakeLakeFS) -> None:
    clean_branch(fake, "main")
    resolves(fake, "ingest-1", "c-src")
    fake.route(
        "GET",
        f"{API}/refs/c-src/merge/main",
        then=Reply(200, merge_base_json("c-src", "c-main", "c-src")),
    )
    assert _lake(fake.url).merge("ingest-1", "main") == "c-main"
    assert fake.calls_to("POST", f"{API}/refs/.*/merge/.*") == [], "nothing to merge"


def test_merge_into_a_dirty_branch_is_refused_before_merging(fake: FakeLakeFS) -> None:
    fake.route(
        "GET",
        f"{API}/branches/main/diff",
        then=Reply(200, listing([diff_json("staged.json", "added", 4)])),
    )
    with pytest.raises(LakeError, match="uncommitted changes"):
        _lake(fake.url).merge("relabel", "main")
    assert [c.path for c in fake.calls] == [f"{API}/branches/main/diff"]


def test_repository_creation_needs_a_storage_namespace(fake: FakeLakeFS) -> None:
    fake.route("GET", API, then=error(404, "repository not found"))
    fake.route("POST", "/api/v1/repositories", then=Reply(201, repository_json()))
    with pytest.raises(LakeError, match="storage_namespace"):
        _lake(fake.url).ensure_repository()
    assert fake.calls_to("POST", "/api/v1/repositories") == []

    _lake(fake.url, storage_namespace="s3://bucket/drive-data").ensure_repository()
    (created,) = fake.calls_to("POST", "/api/v1/repositories")
    assert created.json() == {
        "name": "drive-data",
        "storage_namespace": "s3://bucket/drive-data",
        "default_branch": "main",
        "sample_data": False,
        "read_only": False,
    }


# ------------------------------------------------------------------------ streamed downloads
class _ObjectServingLakeFS(FakeLakeFS):
    """The scripted API, plus object content served as lakeFS serves it: ``GET
    .../refs/{ref}/objects?path=`` answers the whole object (200) or, with a ``Range`` header,
    206 with ``Content-Range``. Every ``Range`` asked for is recorded."""

    def __init__(self, objects: dict[tuple[str, str], bytes]) -> None:
        super().__init__()
        self.objects = objects
        self.ranges: list[str | None] = []

    def _answer(self, handler) -> None:
        path, _, raw_query = handler.path.partition("?")
        match = re.fullmatch(f"{API}/refs/([^/]+)/objects", path)
        query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
        data = self.objects.get((match[1], query.get("path", ""))) if match else None
        if handler.command != "GET" or data is None:
            super()._answer(handler)
            return
        wanted = handler.headers.get("Range")
        self.ranges.append(wanted)
        status, body, headers = 200, data, {}
        if wanted:
            first, last = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
            last = min(last, len(data) - 1)
            status, body = 206, data[first : last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("ETag", '"scripted"')
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)


def _serving(data: bytes) -> _ObjectServingLakeFS:
    server = _ObjectServingLakeFS({("ingest-7", "logs/a.mcap"): data})
    server.route("GET", "/api/v1/config", then=Reply(200, config_json()))
    server.route("GET", API, then=Reply(200, repository_json()))
    return server


def test_download_object_reads_the_api_in_ranges(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lakefs_adapter, "API_READ_BYTES", 1024 * 1024)
    data = os.urandom(2 * 1024 * 1024 + 100)
    server = _serving(data)
    stat(server, "ingest-7", "logs/a.mcap", "lakefs-checksum", size=len(data))
    with serve(server):
        downloaded = _lake(server.url).download_object(
            "ingest-7", "logs/a.mcap", tmp_path / "a.mcap"
        )
    assert (downloaded.size, downloaded.checksum) == (len(data), "lakefs-checksum")
    assert (tmp_path / "a.mcap").read_bytes() == data
    assert server.ranges == [
        "bytes=0-1048575",
        "bytes=1048576-2097151",
        "bytes=2097152-2097251",
    ], "one bounded range per request, and none past the end"
    stats = server.calls_to("GET", f"{API}/refs/ingest-7/objects/stat")
    assert len(stats) == 2, "stat-ed before and after, to notice a replaced object"


def test_an_object_replaced_during_a_download_leaves_no_file(tmp_path: Path) -> None:
    data = b"first version"
    server = _serving(data)
    stat_path = f"{API}/refs/ingest-7/objects/stat"
    before = Reply(200, object_stats_json("logs/a.mcap", "c-1", len(data)))
    after = Reply(200, object_stats_json("logs/a.mcap", "c-2", len(data)))
    server.route("GET", stat_path, before, then=after)
    (tmp_path / "a.mcap").write_bytes(b"older download")
    with serve(server), pytest.raises(ConcurrentUpdateError, match="changed while it was read"):
        _lake(server.url).download_object("ingest-7", "logs/a.mcap", tmp_path / "a.mcap")
    assert (tmp_path / "a.mcap").read_bytes() == b"older download"
    assert [p.name for p in tmp_path.iterdir()] == ["a.mcap"]


def test_download_of_a_missing_or_empty_object(fake: FakeLakeFS, tmp_path: Path) -> None:
    stat(fake, "main", "empty.bin", "empty-checksum", size=0)  # the first matching route answers
    fake.route("GET", f"{API}/refs/main/objects/stat", then=error(404, "path not found"))
    lake = _lake(fake.url)
    with pytest.raises(NotFoundError, match=r"missing\.bin"):
        lake.download_object("main", "missing.bin", tmp_path / "missing.bin")
    assert list(tmp_path.iterdir()) == []
    assert lake.download_object("main", "empty.bin", tmp_path / "empty.bin").size == 0
    assert (tmp_path / "empty.bin").read_bytes() == b""
    assert fake.calls_to("GET", f"{API}/refs/main/objects") == [], "nothing to read: no request"
