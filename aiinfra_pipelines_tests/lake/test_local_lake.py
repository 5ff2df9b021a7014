"""LocalLake-specific guarantees: content addressing, multi-process safety, crash safety and the
delta-based diff path. (Behaviour shared with lakeFS lives in ``test_lake_contract.py``.)"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from aiinfra_pipelines.lake import LakeError, LocalLake, NotFoundError, VersionedLake, local_graph
from aiinfra_pipelines.lake.local import DB_FILENAME, OBJECTS_DIRNAME
from aiinfra_pipelines_tests.lake._workers import put_and_commit


@pytest.fixture
def lake(tmp_path: Path) -> LocalLake:
    local = LocalLake(root=str(tmp_path / "lake"))
    local.ensure_repository()
    return local


def _blob_files(lake: LocalLake) -> list[Path]:
    objects = lake.root_path() / OBJECTS_DIRNAME
    return sorted(p for p in objects.rglob("*") if p.is_file() and not p.name.startswith(".tmp"))


# ------------------------------------------------------------------------- content addressing
def test_objects_are_content_addressed_and_stored_once(lake: LocalLake) -> None:
    payload = b"identical drive log bytes"
    sha = hashlib.sha256(payload).hexdigest()
    lake.create_branch("other")
    lake.put_object("main", "a/log.mcap", payload)
    lake.put_object("main", "b/copy.mcap", payload)
    lake.put_object("other", "c/again.mcap", payload)
    lake.commit("main", "two keys, one content")
    lake.put_object("main", "different.bin", b"other bytes")

    blobs = _blob_files(lake)
    expected = lake.root_path() / OBJECTS_DIRNAME / sha[:2] / sha
    assert expected in blobs
    assert expected.read_bytes() == payload
    assert len(blobs) == 2, "three keys with equal content share one file"
    assert {s.checksum for s in lake.list_objects("main", prefix="a/")} == {sha}


def test_pickles_as_its_configuration(lake: LocalLake) -> None:
    clone = pickle.loads(pickle.dumps(lake))
    assert isinstance(clone, LocalLake)
    assert (clone.root, clone.repository) == (lake.root, lake.repository)
    lake.put_text("main", "x.txt", "x")
    assert clone.get_text("main", "x.txt") == "x", "the clone sees the same lake"


def test_default_root_is_under_dagster_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    default = LocalLake()
    assert default.root_path() == tmp_path / "home" / "lake"
    default.ensure_repository()
    db = tmp_path / "home" / "lake" / DB_FILENAME
    assert db.is_file()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_usable_as_a_dagster_resource(lake: LocalLake) -> None:
    @dg.asset
    def written(lake: VersionedLake) -> str:
        lake.put_text("main", "from_asset.txt", "hello")
        return lake.commit("main", "asset commit", {"asset": "written"})

    result = dg.materialize([written], resources={"lake": lake})
    assert result.success
    commit_id = result.output_for_node("written")
    assert lake.resolve_ref("main") == commit_id
    assert lake.log("main", limit=1)[0].metadata == {"asset": "written"}


# ------------------------------------------------------------------------- concurrency
def test_two_processes_committing_to_one_branch_lose_nothing(lake: LocalLake) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    count = 20
    procs = [
        ctx.Process(target=put_and_commit, args=(lake.root, tag, count, barrier, results))
        for tag in ("alpha", "beta")
    ]
    for proc in procs:
        proc.start()
    reported = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0

    all_ids = reported["alpha"] + reported["beta"]
    assert len(set(all_ids)) == 2 * count
    history = lake.log("main")
    assert len(history) == 2 * count + 1  # + the root commit
    assert set(all_ids) <= {c.id for c in history}
    for child, parent in itertools.pairwise(history):
        assert child.parents == [parent.id], "history stays a single line: no lost commit"
    for tag in ("alpha", "beta"):
        mine = [c.id for c in history if c.metadata.get("writer") == tag]
        assert mine == list(reversed(reported[tag])), f"{tag}'s commits keep their order"

    expected = {f"{tag}/{i:03d}.txt" for tag in ("alpha", "beta") for i in range(count)}
    assert {s.key for s in lake.list_objects("main")} == expected
    assert lake.get_text("main", "beta/007.txt") == "beta-7"
    assert lake.uncommitted("main") == []


def test_threads_committing_concurrently(lake: LocalLake) -> None:
    errors: list[BaseException] = []

    def work(tag: str) -> None:
        try:
            for i in range(5):
                lake.put_text("main", f"{tag}/{i}.txt", tag)
                lake.commit("main", f"{tag} {i}", allow_empty=True)
        except BaseException as exc:  # surface in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(lake.log("main")) == 4 * 5 + 1
    assert len(lake.list_objects("main")) == 4 * 5


# ------------------------------------------------------------------------- crash safety
def test_leftover_temp_file_from_a_crash_does_not_corrupt_reads(lake: LocalLake) -> None:
    payload = b"complete content"
    sha = hashlib.sha256(payload).hexdigest()
    lake.put_object("main", "kept.bin", b"kept")
    lake.commit("main", "kept")
    # A writer died after creating its temp file (partially written) but before os.replace.
    shard = lake.root_path() / OBJECTS_DIRNAME / sha[:2]
    shard.mkdir(parents=True, exist_ok=True)
    stray = shard / f".tmp-{sha[:12]}-crashed"
    stray.write_bytes(payload[:5])

    assert lake.get_object("main", "kept.bin") == b"kept"
    assert [s.key for s in lake.list_objects("main")] == ["kept.bin"]
    stat = lake.put_object("main", "new.bin", payload)  # same content the crashed writer had
    assert stat.checksum == sha
    assert lake.get_object("main", "new.bin") == payload
    assert (shard / sha).read_bytes() == payload


def test_failed_write_stages_nothing_and_leaves_no_temp_file(lake: LocalLake, monkeypatch) -> None:
    lake.put_text("main", "doc.txt", "v1")
    lake.commit("main", "v1")

    def crash(*_args, **_kwargs):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        lake.put_text("main", "doc.txt", "v2")
    monkeypatch.undo()

    assert lake.get_text("main", "doc.txt") == "v1"
    assert lake.uncommitted("main") == []
    objects = lake.root_path() / OBJECTS_DIRNAME
    assert [p for p in objects.rglob(".tmp*")] == []


def test_corrupted_content_is_detected_on_read(lake: LocalLake) -> None:
    stat = lake.put_object("main", "model.bin", b"good weights")
    blob = lake.root_path() / OBJECTS_DIRNAME / stat.checksum[:2] / stat.checksum
    blob.write_bytes(b"bad weights!")
    with pytest.raises(LakeError, match="checksum"):
        lake.get_object("main", "model.bin")


# ------------------------------------------------------------------------- files, large objects
def _blob(lake: LocalLake, sha: str) -> Path:
    return lake.root_path() / OBJECTS_DIRNAME / sha[:2] / sha


def _temp_files(lake: LocalLake) -> list[Path]:
    return [p for p in lake.root_path().rglob(".tmp*")]


def test_download_of_corrupted_content_raises_and_leaves_no_file(
    lake: LocalLake, tmp_path: Path
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)  # several blocks: the mismatch shows only at the end
    stat = lake.put_object("main", "model.bin", data)
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    _blob(lake, stat.checksum).write_bytes(bytes(damaged))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(LakeError, match="checksum"):
        lake.download_object("main", "model.bin", out / "model.bin")
    assert list(out.iterdir()) == [], "neither the file nor its temporary sibling"

    (out / "model.bin").write_bytes(b"previous")
    _blob(lake, stat.checksum).write_bytes(data[:-1])  # truncated
    with pytest.raises(LakeError, match="checksum"):
        lake.download_object("main", "model.bin", out / "model.bin")
    _blob(lake, stat.checksum).unlink()
    with pytest.raises(LakeError, match="missing") as missing:
        lake.download_object("main", "model.bin", out / "model.bin")
    assert not isinstance(missing.value, NotFoundError), "a damaged store is not a missing key"
    assert [p.name for p in out.iterdir()] == ["model.bin"]
    assert (out / "model.bin").read_bytes() == b"previous"


def test_upload_file_is_content_addressed_and_crash_safe(
    lake: LocalLake, tmp_path: Path, monkeypatch
) -> None:
    source = tmp_path / "log.mcap"
    source.write_bytes(os.urandom(2 * 1024 * 1024 + 7))
    first = lake.upload_file("main", "logs/a.mcap", source)
    again = lake.upload_file("main", "logs/b.mcap", source)
    assert first.checksum == again.checksum == hashlib.sha256(source.read_bytes()).hexdigest()
    assert _blob(lake, first.checksum).read_bytes() == source.read_bytes()
    assert _blob_files(lake) == [_blob(lake, first.checksum)], "stored once"
    assert _temp_files(lake) == []

    def crash(*_args, **_kwargs):
        raise OSError("simulated crash before rename")

    source.write_bytes(b"another log")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        lake.upload_file("main", "logs/c.mcap", source)
    monkeypatch.undo()
    assert not lake.object_exists("main", "logs/c.mcap")
    assert _temp_files(lake) == []


def test_completing_an_upload_streams_parts_and_checks_each_etag(lake: LocalLake) -> None:
    lake = LocalLake(root=lake.root, upload_min_part_bytes=1024 * 1024)
    parts = [os.urandom(1024 * 1024 + 3), os.urandom(1024 * 1024), os.urandom(10)]
    upload = lake.begin_upload("main", "logs/parts.mcap")
    etags = {n: lake.upload_part(upload, n, data) for n, data in enumerate(parts, start=1)}
    assert lake.uploaded_parts(upload) == etags

    with pytest.raises(LakeError, match="part 2 ETag mismatch"):
        lake.complete_upload(upload, {**etags, 2: etags[1]})
    assert not lake.object_exists("main", "logs/parts.mcap")
    assert _temp_files(lake) == [], "the bytes streamed before the mismatch are discarded"
    assert lake.uploaded_parts(upload) == etags, "a refused completion leaves the upload open"

    stat = lake.complete_upload(upload, etags)
    joined = b"".join(parts)
    assert stat.checksum == hashlib.sha256(joined).hexdigest()
    assert lake.get_object("main", "logs/parts.mcap") == joined
    with pytest.raises(NotFoundError):
        lake.uploaded_parts(upload)


def test_the_default_upload_file_aborts_an_upload_that_fails(tmp_path: Path, monkeypatch) -> None:
    """The port's multipart ``upload_file`` leaves no parts behind and reports the failure."""
    lake = LocalLake(root=str(tmp_path / "lake"), upload_min_part_bytes=1024 * 1024)
    lake.ensure_repository()
    source = tmp_path / "log.mcap"
    source.write_bytes(os.urandom(3 * 1024 * 1024 + 1))
    sent = []
    real_upload_part = LocalLake.upload_part

    def flaky_upload_part(self, upload, part_number, data):
        if part_number == 2:
            raise OSError("link lost during part 2")
        sent.append(len(data))
        return real_upload_part(self, upload, part_number, data)

    monkeypatch.setattr(LocalLake, "upload_part", flaky_upload_part)
    with pytest.raises(OSError, match="part 2"):
        VersionedLake.upload_file(lake, "main", "logs/a.mcap", source)
    assert sent == [1024 * 1024], "one part in memory at a time"
    assert list((lake.root_path() / "uploads").iterdir()) == [], "the upload was aborted"
    assert not lake.object_exists("main", "logs/a.mcap")


@pytest.mark.slow  # writes ~1 GB to disk
def test_large_file_transfers_keep_memory_bounded(lake: LocalLake, tmp_path: Path) -> None:
    """A 200 MB file moves in, out and in again (multipart) in a child process whose peak RSS
    rises by well under the file's size: nothing holds the object whole."""
    size = 200 * 1024 * 1024
    source = tmp_path / "drive.mcap"
    block = os.urandom(1024 * 1024)
    with source.open("wb") as handle:
        for _ in range(size // len(block)):
            handle.write(block)
    destination = tmp_path / "downloaded.mcap"
    started = time.monotonic()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from aiinfra_pipelines_tests.lake._workers import file_transfer_peak_growth\n"
            "print(json.dumps(file_transfer_peak_growth(*sys.argv[1:])))",
            lake.root,
            str(source),
            str(destination),
        ],
        capture_output=True,
        timeout=300,
        check=True,
    )
    growth_kib = json.loads(child.stdout.decode().strip().splitlines()[-1])
    assert max(growth_kib.values()) < 64 * 1024, (growth_kib, time.monotonic() - started)
    with source.open("rb") as handle:
        expected = hashlib.file_digest(handle, "sha256").hexdigest()
    with destination.open("rb") as handle:
        assert hashlib.file_digest(handle, "sha256").hexdigest() == expected
    big, parts = (lake.stat_object("main", k) for k in ("logs/big.mcap", "logs/parts.mcap"))
    assert (big.size, big.checksum) == (parts.size, parts.checksum) == (size, expected)


# ------------------------------------------------------------------------- delta diff path
def _tree(lake: LocalLake, ref: str) -> dict[str, str]:
    return {s.key: s.checksum for s in lake.list_objects(ref)}


def _expected_diff(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            out.append((key, "added"))
        elif key not in new:
            out.append((key, "removed"))
        elif old[key] != new[key]:
            out.append((key, "changed"))
    return out


def test_diff_against_ancestor_uses_deltas_and_is_correct(lake: LocalLake, monkeypatch) -> None:
    rng = random.Random(7)
    commits: list[str] = []
    trees: list[dict[str, str]] = []
    for i in range(50):
        existing = [s.key for s in lake.list_objects("main")]
        for _ in range(3):
            action = rng.random()
            if existing and action < 0.25:
                lake.delete_object("main", existing.pop(rng.randrange(len(existing))))
            elif existing and action < 0.6:
                lake.put_text("main", rng.choice(existing), f"rewrite {i} {rng.random()}")
            else:
                lake.put_text("main", f"k/{rng.randrange(40):02d}.txt", f"new {i}")
        commits.append(lake.commit("main", f"c{i}", allow_empty=True))
        trees.append(_tree(lake, commits[-1]))

    def no_full_scan(*_args, **_kwargs):
        raise AssertionError("diff between first-parent relatives must not join full trees")

    monkeypatch.setattr(local_graph, "diff_full", no_full_scan)
    for i in (0, 1, 17, 33, 48, 49):
        forward = lake.diff(commits[i], "main")
        assert [(e.key, e.type) for e in forward] == _expected_diff(trees[i], trees[-1])
        backward = lake.diff("main", commits[i])
        assert [(e.key, e.type) for e in backward] == _expected_diff(trees[-1], trees[i])
    expected_sub = [kt for kt in _expected_diff(trees[10], trees[20]) if kt[0].startswith("k/1")]
    assert expected_sub, "the seeded history changes some k/1* keys between c10 and c20"
    sub = lake.diff(commits[10], commits[20], prefix="k/1")
    assert [(e.key, e.type) for e in sub] == expected_sub
    monkeypatch.undo()

    # sibling branches are not first-parent relatives: the full-tree path must agree too
    lake.create_branch("side", source_ref=commits[25])
    lake.put_text("side", "side.txt", "s")
    lake.commit("side", "side")
    assert [(e.key, e.type) for e in lake.diff("side", "main")] == _expected_diff(
        _tree(lake, "side"), trees[-1]
    )


def test_diff_through_merges_on_main_uses_first_parent_deltas(lake: LocalLake, monkeypatch) -> None:
    """The ingest sensor's case: main advances by merging ingest branches; diff(last seen,
    main) must follow main's first-parent line and see the merged files."""
    seen = lake.resolve_ref("main")
    for batch in range(5):
        branch = f"ingest-{batch}"
        lake.create_branch(branch)
        lake.put_text(branch, f"raw/{batch}.mcap", str(batch))
        lake.commit(branch, f"upload {batch}")
        lake.merge(branch, "main")

    monkeypatch.setattr(local_graph, "diff_full", lambda *a, **k: pytest.fail("full scan"))
    assert [(e.key, e.type) for e in lake.diff(seen, "main")] == [
        (f"raw/{b}.mcap", "added") for b in range(5)
    ]
    merges = lake.log("main", stop_at=seen)
    assert sum(1 for c in merges if len(c.parents) == 2) == 5
