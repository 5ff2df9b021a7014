"""The ONE contract suite every ``VersionedLake`` adapter must pass.

``local`` always runs. ``lakefs`` runs against a real server when ``LAKEFS_ENDPOINT`` is set
(with ``LAKEFS_ACCESS_KEY_ID``, ``LAKEFS_SECRET_ACCESS_KEY`` and ``LAKEFS_STORAGE_NAMESPACE``);
each test gets its own repository, deleted afterwards. (``test_lakefs_offline.py`` and
``test_s3_gateway.py`` drive ``LakeFSLake`` without a server, against scripted HTTP.)

``LocalLake`` runs with small upload parts (256 KiB instead of S3's 5 MiB), so the multipart
paths are exercised with files of a few MB.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiinfra_pipelines.lake import (
    BranchExistsError,
    InvalidKeyError,
    LakeError,
    LakeFSLake,
    LocalLake,
    MergeConflictError,
    NotFoundError,
    NothingToCommitError,
    TagExistsError,
    VersionedLake,
)

_LOCAL_MIN_PART_BYTES = 256 * 1024

_LAKEFS_PARAM = pytest.param(
    "lakefs",
    marks=[
        pytest.mark.lakefs,
        pytest.mark.skipif(
            not os.environ.get("LAKEFS_ENDPOINT"), reason="LAKEFS_ENDPOINT is not set"
        ),
    ],
)


def _lakefs_lake() -> LakeFSLake:
    repository = f"contract-{uuid.uuid4().hex[:12]}"
    namespace = os.environ.get("LAKEFS_STORAGE_NAMESPACE", "local://contract-tests").rstrip("/")
    return LakeFSLake(
        repository=repository,
        endpoint=os.environ["LAKEFS_ENDPOINT"],
        access_key_id=os.environ.get("LAKEFS_ACCESS_KEY_ID", ""),
        secret_access_key=os.environ.get("LAKEFS_SECRET_ACCESS_KEY", ""),
        storage_namespace=f"{namespace}/{repository}",
    )


@pytest.fixture(params=["local", _LAKEFS_PARAM])
def lake(request: pytest.FixtureRequest, tmp_path) -> Iterator[VersionedLake]:
    if request.param == "local":
        local = LocalLake(root=str(tmp_path / "lake"), upload_min_part_bytes=_LOCAL_MIN_PART_BYTES)
        local.ensure_repository()
        yield local
        return
    import lakefs

    remote = _lakefs_lake()
    remote.ensure_repository()
    try:
        yield remote
    finally:
        lakefs.Repository(remote.repository, client=remote.client).delete()


def _keys(entries) -> list[str]:
    return [e.key for e in entries]


# ------------------------------------------------------------------------------- repository
def test_ensure_repository_is_idempotent(lake: VersionedLake) -> None:
    head = lake.resolve_ref("main")
    lake.ensure_repository()
    assert lake.resolve_ref("main") == head
    assert [b.name for b in lake.list_branches()] == ["main"]
    history = lake.log("main")
    assert len(history) == 1, "a new repository has exactly one (initial) commit"
    assert history[0].parents == []


# ------------------------------------------------------------------------------- branches
def test_branch_lifecycle(lake: VersionedLake) -> None:
    main_head = lake.resolve_ref("main")
    created = lake.create_branch("ingest-b1")
    assert created.name == "ingest-b1"
    assert created.head == main_head
    lake.create_branch("ingest-b2", source_ref="ingest-b1")
    lake.create_branch("scratch")

    assert lake.branch_exists("ingest-b1")
    assert not lake.branch_exists("ingest-nope")
    assert [b.name for b in lake.list_branches(prefix="ingest-")] == ["ingest-b1", "ingest-b2"]
    assert [b.name for b in lake.list_branches()] == ["ingest-b1", "ingest-b2", "main", "scratch"]

    with pytest.raises(BranchExistsError, match="ingest-b1"):
        lake.create_branch("ingest-b1")
    lake.put_text("ingest-b1", "x.txt", "x")
    lake.commit("ingest-b1", "move b1")
    again = lake.create_branch("ingest-b1", exist_ok=True)
    assert again.head == lake.resolve_ref("ingest-b1") != main_head, "exist_ok keeps the branch"

    lake.delete_branch("ingest-b2")
    assert not lake.branch_exists("ingest-b2")
    with pytest.raises(NotFoundError):
        lake.delete_branch("ingest-b2")
    with pytest.raises(LakeError, match="main"):
        lake.delete_branch("main")
    assert lake.branch_exists("main")

    with pytest.raises(NotFoundError):
        lake.create_branch("from-nowhere", source_ref="no-such-ref")
    with pytest.raises(InvalidKeyError, match="ingest/b3"):
        lake.create_branch("ingest/b3")


def test_new_branch_does_not_inherit_staged_changes(lake: VersionedLake) -> None:
    lake.put_text("main", "staged.txt", "uncommitted")
    lake.create_branch("child")
    assert not lake.object_exists("child", "staged.txt")
    assert lake.object_exists("main", "staged.txt")


# ------------------------------------------------------------------------------- objects
def test_objects_are_staged_on_their_branch(lake: VersionedLake) -> None:
    lake.create_branch("work")
    stat = lake.put_object("work", "logs/b.mcap", b"bbbb")
    lake.put_object("work", "logs/a.mcap", b"aa")
    lake.put_object("work", "meta.json", b"{}")

    assert stat.key == "logs/b.mcap"
    assert stat.size == 4
    assert stat.checksum
    assert lake.get_object("work", "logs/b.mcap") == b"bbbb"
    assert lake.stat_object("work", "logs/b.mcap") == stat
    assert lake.object_exists("work", "logs/a.mcap")
    assert _keys(lake.list_objects("work")) == ["logs/a.mcap", "logs/b.mcap", "meta.json"]
    assert _keys(lake.list_objects("work", prefix="logs/")) == ["logs/a.mcap", "logs/b.mcap"]
    assert [s.size for s in lake.list_objects("work", prefix="logs/")] == [2, 4]

    # isolation: nothing leaks to main, and the branch HEAD commit does not have them yet
    assert not lake.object_exists("main", "logs/a.mcap")
    assert lake.list_objects(lake.resolve_ref("work")) == []

    assert [(e.key, e.type) for e in lake.uncommitted("work")] == [
        ("logs/a.mcap", "added"),
        ("logs/b.mcap", "added"),
        ("meta.json", "added"),
    ]
    lake.commit("work", "add logs")
    assert lake.uncommitted("work") == []

    lake.put_object("work", "logs/a.mcap", b"AAAA")
    lake.delete_object("work", "meta.json")
    assert lake.get_object("work", "logs/a.mcap") == b"AAAA"
    assert not lake.object_exists("work", "meta.json")
    with pytest.raises(NotFoundError):
        lake.get_object("work", "meta.json")
    assert _keys(lake.list_objects("work")) == ["logs/a.mcap", "logs/b.mcap"]
    assert [(e.key, e.type) for e in lake.uncommitted("work")] == [
        ("logs/a.mcap", "changed"),
        ("meta.json", "removed"),
    ]
    # the committed state is still readable through the commit id
    head = lake.resolve_ref("work")
    assert lake.get_object(head, "logs/a.mcap") == b"aa"
    assert lake.object_exists(head, "meta.json")

    with pytest.raises(NotFoundError):
        lake.delete_object("work", "never-there.txt")


def test_restaging_identical_content_is_not_a_change(lake: VersionedLake) -> None:
    lake.put_object("main", "same.bin", b"same")
    lake.commit("main", "add")
    lake.put_object("main", "same.bin", b"same")
    assert lake.uncommitted("main") == []
    with pytest.raises(NothingToCommitError):
        lake.commit("main", "no-op")


def test_text_and_json_helpers(lake: VersionedLake) -> None:
    lake.put_text("main", "notes/readme.txt", "grüße\n")
    assert lake.get_text("main", "notes/readme.txt") == "grüße\n"
    first = lake.put_json("main", "cfg/a.json", {"b": 1, "a": [1, 2]})
    second = lake.put_json("main", "cfg/b.json", {"a": [1, 2], "b": 1})
    assert lake.get_json("main", "cfg/a.json") == {"a": [1, 2], "b": 1}
    assert first.checksum == second.checksum, "equal values serialise to identical bytes"


def test_empty_object_round_trips(lake: VersionedLake) -> None:
    stat = lake.put_object("main", "empty.bin", b"")
    assert stat.size == 0
    assert lake.get_object("main", "empty.bin") == b""


# ------------------------------------------------------------------------------- commits
def test_commit_returns_id_and_round_trips_metadata(lake: VersionedLake) -> None:
    parent = lake.resolve_ref("main")
    lake.put_text("main", "a.txt", "a")
    metadata = {"batch": "b-0001", "source": "fleet-sim"}
    commit_id = lake.commit("main", "ingest batch b-0001", metadata=metadata)

    assert commit_id == lake.resolve_ref("main")
    newest = lake.log("main")[0]
    assert newest.id == commit_id
    assert newest.message == "ingest batch b-0001"
    assert newest.metadata == metadata
    assert newest.parents == [parent]
    assert newest.created_at.tzinfo is not None

    with pytest.raises(NothingToCommitError):
        lake.commit("main", "nothing staged")
    assert lake.resolve_ref("main") == commit_id, "a refused commit leaves the head alone"

    empty = lake.commit("main", "marker", allow_empty=True)
    assert empty != commit_id
    assert lake.log("main", limit=1)[0].parents == [commit_id]

    with pytest.raises(LakeError):
        lake.commit("main", "bad metadata", metadata={"n": 1}, allow_empty=True)  # type: ignore[dict-item]


def test_log_order_limit_and_stop_at(lake: VersionedLake) -> None:
    root = lake.resolve_ref("main")
    ids = []
    for i in range(4):
        lake.put_text("main", f"f{i}.txt", str(i))
        ids.append(lake.commit("main", f"commit {i}"))

    history = lake.log("main")
    assert [c.id for c in history] == [*reversed(ids), root]
    assert [c.message for c in history[:2]] == ["commit 3", "commit 2"]
    assert [c.id for c in lake.log("main", limit=2)] == [ids[3], ids[2]]
    assert [c.id for c in lake.log("main", stop_at=ids[1])] == [ids[3], ids[2]]
    assert [c.id for c in lake.log("main", stop_at=ids[3])] == []
    assert [c.id for c in lake.log(ids[1])] == [ids[1], ids[0], root]


def test_old_commit_still_reads_overwritten_object(lake: VersionedLake) -> None:
    lake.put_text("main", "model/weights.bin", "v1")
    first = lake.commit("main", "v1")
    lake.put_text("main", "model/weights.bin", "v2")
    second = lake.commit("main", "v2")
    lake.delete_object("main", "model/weights.bin")
    lake.commit("main", "rm")

    assert lake.get_text(first, "model/weights.bin") == "v1"
    assert lake.get_text(second, "model/weights.bin") == "v2"
    assert not lake.object_exists("main", "model/weights.bin")
    assert lake.stat_object(first, "model/weights.bin").size == 2


# ------------------------------------------------------------------------------- diff
def _forked(lake: VersionedLake) -> tuple[str, str]:
    """main has base.txt; 'feature' forks, adds feat.txt and changes base.txt; main then adds
    main.txt. Returns (fork point, feature head)."""
    lake.put_text("main", "base.txt", "base")
    lake.put_text("main", "gone.txt", "old")
    fork = lake.commit("main", "base")
    lake.create_branch("feature")
    lake.put_text("feature", "feat.txt", "feature work")
    lake.put_text("feature", "base.txt", "base v2")
    lake.delete_object("feature", "gone.txt")
    feature_head = lake.commit("feature", "feature work")
    lake.put_text("main", "main.txt", "main moved on")
    lake.commit("main", "main moves")
    return fork, feature_head


def test_diff_two_dot_both_directions(lake: VersionedLake) -> None:
    _forked(lake)
    forward = lake.diff("main", "feature")
    assert [(e.key, e.type) for e in forward] == [
        ("base.txt", "changed"),
        ("feat.txt", "added"),
        ("gone.txt", "removed"),
        ("main.txt", "removed"),
    ]
    assert next(e for e in forward if e.key == "feat.txt").size == len("feature work")
    backward = lake.diff("feature", "main")
    assert [(e.key, e.type) for e in backward] == [
        ("base.txt", "changed"),
        ("feat.txt", "removed"),
        ("gone.txt", "added"),
        ("main.txt", "added"),
    ]
    assert lake.diff("main", "main") == []


def test_diff_uses_committed_trees_not_staged_changes(lake: VersionedLake) -> None:
    _forked(lake)
    lake.put_text("feature", "staged-only.txt", "not committed")
    assert "staged-only.txt" not in _keys(lake.diff("main", "feature"))


def test_diff_three_dot_shows_only_what_right_added_since_fork(lake: VersionedLake) -> None:
    fork, feature_head = _forked(lake)
    three = lake.diff("main", "feature", three_dot=True)
    assert [(e.key, e.type) for e in three] == [
        ("base.txt", "changed"),
        ("feat.txt", "added"),
        ("gone.txt", "removed"),
    ]
    assert lake.diff(fork, feature_head) == three, "three-dot == two-dot from the merge base"
    assert [(e.key, e.type) for e in lake.diff("feature", "main", three_dot=True)] == [
        ("main.txt", "added")
    ]


def test_diff_prefix_and_ancestor_commits(lake: VersionedLake) -> None:
    lake.put_text("main", "raw/a.mcap", "a")
    lake.put_text("main", "derived/a.parquet", "p")
    first = lake.commit("main", "one")
    lake.put_text("main", "raw/b.mcap", "b")
    lake.put_text("main", "derived/a.parquet", "p2")
    lake.commit("main", "two")
    assert [(e.key, e.type) for e in lake.diff(first, "main", prefix="raw/")] == [
        ("raw/b.mcap", "added")
    ]
    assert [(e.key, e.type) for e in lake.diff(first, "main")] == [
        ("derived/a.parquet", "changed"),
        ("raw/b.mcap", "added"),
    ]


# ------------------------------------------------------------------------------- merge
def test_merge_clean_brings_source_commits_and_records_metadata(lake: VersionedLake) -> None:
    _, feature_head = _forked(lake)
    main_before = lake.resolve_ref("main")
    merged = lake.merge("feature", "main", message="publish feature", metadata={"run": "r-42"})

    assert merged == lake.resolve_ref("main")
    assert lake.get_text("main", "feat.txt") == "feature work"
    assert lake.get_text("main", "base.txt") == "base v2"
    assert lake.get_text("main", "main.txt") == "main moved on", "destination work is kept"
    assert not lake.object_exists("main", "gone.txt")

    newest = lake.log("main", limit=1)[0]
    assert newest.id == merged
    assert newest.message == "publish feature"
    assert newest.metadata.get("run") == "r-42"
    assert newest.parents == [main_before, feature_head]
    assert feature_head in {c.id for c in lake.log("main")}
    assert lake.diff("main", "feature", three_dot=True) == [], "nothing left to merge"

    assert lake.merge("feature", "main") == merged, "re-merging an ancestor is a no-op"


def test_merge_conflict_names_keys_and_leaves_destination(lake: VersionedLake) -> None:
    lake.put_text("main", "labels/0001.json", "v0")
    lake.put_text("main", "labels/0002.json", "v0")
    lake.commit("main", "base")
    lake.create_branch("relabel")
    lake.put_text("relabel", "labels/0001.json", "from relabel")
    lake.put_text("relabel", "labels/0002.json", "same on both")
    lake.commit("relabel", "relabel")
    lake.put_text("main", "labels/0001.json", "from main")
    lake.put_text("main", "labels/0002.json", "same on both")
    main_head = lake.commit("main", "hotfix")

    with pytest.raises(MergeConflictError) as caught:
        lake.merge("relabel", "main")
    assert caught.value.conflicts == ["labels/0001.json"]
    assert "labels/0001.json" in str(caught.value)
    assert lake.resolve_ref("main") == main_head
    assert lake.get_text("main", "labels/0001.json") == "from main"
    assert lake.uncommitted("main") == []


def test_merge_refuses_destination_with_uncommitted_changes(lake: VersionedLake) -> None:
    _forked(lake)
    lake.put_text("main", "wip.txt", "uncommitted")
    head = lake.resolve_ref("main")
    with pytest.raises(LakeError, match="uncommitted"):
        lake.merge("feature", "main")
    assert lake.resolve_ref("main") == head


# ------------------------------------------------------------------------------- tags
def test_tags_create_list_resolve_delete(lake: VersionedLake) -> None:
    lake.put_text("main", "dataset/manifest.json", "[1]")
    commit_id = lake.commit("main", "dataset")
    assert lake.create_tag("dataset-v0001", "main") == commit_id
    assert lake.list_tags() == {"dataset-v0001": commit_id}
    assert lake.resolve_ref("dataset-v0001") == commit_id

    lake.put_text("main", "dataset/manifest.json", "[1, 2]")
    lake.commit("main", "next")
    assert lake.get_text("dataset-v0001", "dataset/manifest.json") == "[1]", "tags are frozen"

    with pytest.raises(TagExistsError):
        lake.create_tag("dataset-v0001", "main")
    lake.delete_tag("dataset-v0001")
    assert lake.list_tags() == {}
    with pytest.raises(NotFoundError):
        lake.resolve_ref("dataset-v0001")
    with pytest.raises(NotFoundError):
        lake.delete_tag("dataset-v0001")
    assert lake.get_text(commit_id, "dataset/manifest.json") == "[1]", "the commit survives"


# ------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bad_key", ["../x", "/abs", "a//b", "a/./b", "", "trailing/", "a\\b"])
def test_invalid_keys_are_rejected(lake: VersionedLake, bad_key: str) -> None:
    with pytest.raises(InvalidKeyError):
        lake.put_object("main", bad_key, b"x")
    with pytest.raises(InvalidKeyError):
        lake.get_object("main", bad_key)
    assert lake.uncommitted("main") == []


def test_missing_things_raise_not_found(lake: VersionedLake) -> None:
    with pytest.raises(NotFoundError):
        lake.get_object("main", "missing.txt")
    with pytest.raises(NotFoundError):
        lake.stat_object("main", "missing.txt")
    with pytest.raises(NotFoundError):
        lake.put_object("no-such-branch", "a.txt", b"a")
    with pytest.raises(NotFoundError):
        lake.commit("no-such-branch", "x", allow_empty=True)
    missing_ref = "0" * 64
    with pytest.raises(NotFoundError):
        lake.resolve_ref(missing_ref)
    with pytest.raises(NotFoundError):
        lake.get_object(missing_ref, "a.txt")
    with pytest.raises(NotFoundError):
        lake.object_exists("no-such-branch", "a.txt")
    with pytest.raises(NotFoundError):
        lake.log("no-such-branch")
    with pytest.raises(NotFoundError):
        lake.diff("main", "no-such-branch")
    with pytest.raises(NotFoundError):
        lake.merge("no-such-branch", "main")


def test_local_checksum_is_sha256_of_content(lake: VersionedLake) -> None:
    stat = lake.put_object("main", "x.bin", b"payload")
    if isinstance(lake, LocalLake):
        assert stat.checksum == hashlib.sha256(b"payload").hexdigest()
    else:  # lakeFS reports the object store's checksum; it must at least be stable
        assert lake.stat_object("main", "x.bin").checksum == stat.checksum


# ------------------------------------------------------------------------- resumable uploads
def test_a_resumable_upload_is_invisible_until_complete_and_resumes(lake: VersionedLake) -> None:
    lake.create_branch("ingest-up", "main")
    size = lake.min_part_bytes
    data = os.urandom(2 * size + 1000)
    chunks = [data[:size], data[size : 2 * size], data[2 * size :]]
    upload = lake.begin_upload("ingest-up", "logs/a.mcap")
    arrived = {1: lake.upload_part(upload, 1, chunks[0])}
    assert not lake.object_exists("ingest-up", "logs/a.mcap")
    assert lake.uploaded_parts(upload) == arrived  # what a restarted uploader reads back
    arrived[2] = lake.upload_part(upload, 2, chunks[1])
    arrived[2] = lake.upload_part(upload, 2, chunks[1])  # re-sent after a lost reply: replaces
    arrived[3] = lake.upload_part(upload, 3, chunks[2])
    assert lake.uploaded_parts(upload) == arrived
    stat = lake.complete_upload(upload, arrived)
    assert stat.size == len(data)
    assert lake.get_object("ingest-up", "logs/a.mcap") == data
    assert [e.key for e in lake.uncommitted("ingest-up")] == ["logs/a.mcap"]
    with pytest.raises(NotFoundError):
        lake.uploaded_parts(upload)


def test_an_upload_with_a_small_middle_part_or_a_missing_part_is_refused(
    lake: VersionedLake,
) -> None:
    lake.create_branch("ingest-bad", "main")
    upload = lake.begin_upload("ingest-bad", "logs/b.mcap")
    small = {1: lake.upload_part(upload, 1, b"x" * 10), 2: lake.upload_part(upload, 2, b"y")}
    with pytest.raises(LakeError):
        lake.complete_upload(upload, small)
    with pytest.raises(LakeError):
        lake.complete_upload(upload, {1: small[1], 3: small[2]})
    lake.abort_upload(upload)
    lake.abort_upload(upload)  # already gone: no error
    with pytest.raises(NotFoundError):
        lake.uploaded_parts(upload)
    assert not lake.object_exists("ingest-bad", "logs/b.mcap")
    with pytest.raises(NotFoundError):
        lake.begin_upload("no-such-branch", "logs/c.mcap")


# ------------------------------------------------------------------------ files, large objects
def _random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def test_upload_file_and_download_object_round_trip(lake: VersionedLake, tmp_path: Path) -> None:
    lake.create_branch("ingest-big")
    part = lake._upload_file_part_bytes(0)
    size = 2 * max(part, lake.min_part_bytes) + 1000  # several parts, whatever the adapter
    source = tmp_path / "drive.mcap"
    data = _random_file(source, size)

    stat = lake.upload_file("ingest-big", "logs/drive.mcap", source)
    assert (stat.key, stat.size) == ("logs/drive.mcap", size)
    assert lake.stat_object("ingest-big", "logs/drive.mcap") == stat
    assert [(e.key, e.type) for e in lake.uncommitted("ingest-big")] == [
        ("logs/drive.mcap", "added")
    ]
    if isinstance(lake, LocalLake):
        assert stat.checksum == hashlib.sha256(data).hexdigest()

    out = tmp_path / "out"
    out.mkdir()
    destination = out / "drive.mcap"
    assert lake.download_object("ingest-big", "logs/drive.mcap", destination) == stat
    assert destination.read_bytes() == data

    # through a commit id, over an existing file, and given as a str path
    commit = lake.commit("ingest-big", "land a log")
    destination.write_bytes(b"an older download")
    assert lake.download_object(commit, "logs/drive.mcap", str(destination)) == stat
    assert destination.read_bytes() == data
    assert [p.name for p in out.iterdir()] == ["drive.mcap"], "no temporary file is left"


def test_file_transfers_of_small_and_empty_files(lake: VersionedLake, tmp_path: Path) -> None:
    for name, size in (("empty", 0), ("small", 1000)):
        source = tmp_path / f"{name}.bin"
        data = _random_file(source, size)
        stat = lake.upload_file("main", f"files/{name}.bin", source)
        assert stat == lake.stat_object("main", f"files/{name}.bin")
        assert stat.size == size
        assert lake.get_object("main", f"files/{name}.bin") == data
        destination = tmp_path / f"{name}.out"
        assert lake.download_object("main", f"files/{name}.bin", destination) == stat
        assert destination.read_bytes() == data
    # re-uploading replaces the staged content, like put_object
    (tmp_path / "small.bin").write_bytes(b"second version")
    stat = lake.upload_file("main", "files/small.bin", tmp_path / "small.bin")
    assert lake.get_object("main", "files/small.bin") == b"second version"
    assert stat.size == len(b"second version")


def test_the_port_default_file_transfers_work_on_every_adapter(
    lake: VersionedLake, tmp_path: Path
) -> None:
    """``VersionedLake``'s own ``upload_file`` (one ``put_object``, or a resumable upload part
    by part) and ``download_object`` (``get_object``), on the adapter's primitives: what an
    adapter that does not override them gets."""
    part = lake._upload_file_part_bytes(0)
    for name, size in (("one-part", part), ("parts", 2 * part + 1000)):
        source = tmp_path / f"{name}.bin"
        data = _random_file(source, size)
        stat = VersionedLake.upload_file(lake, "main", f"default/{name}.bin", source)
        assert stat == lake.stat_object("main", f"default/{name}.bin")
        assert stat.size == size
        destination = tmp_path / f"{name}.out"
        assert VersionedLake.download_object(lake, "main", f"default/{name}.bin", destination) == (
            stat
        )
        assert destination.read_bytes() == data
        assert lake.download_object("main", f"default/{name}.bin", destination) == stat


def test_file_transfers_refuse_missing_things_and_leave_no_file(
    lake: VersionedLake, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    destination = out / "x.bin"
    with pytest.raises(NotFoundError):
        lake.download_object("main", "missing.bin", destination)
    with pytest.raises(NotFoundError):
        lake.download_object("0" * 64, "a.txt", destination)
    with pytest.raises(InvalidKeyError):
        lake.download_object("main", "../x", destination)
    assert list(out.iterdir()) == [], "no file, not even a temporary one"

    destination.write_bytes(b"previous download")
    with pytest.raises(NotFoundError):
        lake.download_object("main", "missing.bin", destination)
    assert destination.read_bytes() == b"previous download", "a failed download changes nothing"
    assert [p.name for p in out.iterdir()] == ["x.bin"]

    source = tmp_path / "a.bin"
    source.write_bytes(b"a")
    with pytest.raises(NotFoundError):
        lake.upload_file("no-such-branch", "a.bin", source)
    with pytest.raises(InvalidKeyError):
        lake.upload_file("main", "a//b", source)
    with pytest.raises(InvalidKeyError):
        lake.upload_file("ingest/bad", "a.bin", source)
    with pytest.raises(FileNotFoundError):
        lake.upload_file("main", "a.bin", tmp_path / "no-such-file")
    assert lake.uncommitted("main") == []
