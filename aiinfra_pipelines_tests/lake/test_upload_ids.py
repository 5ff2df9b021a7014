"""Upload ids are input, not paths: a crafted id cannot reach outside the uploads folder.

Measured before the fix: ``abort_upload`` with the id ``../objects`` deleted the lake's object
store (a committed object then read as missing) and ``../../../victim`` deleted a folder
outside the lake root."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.lake.errors import InvalidKeyError, LakeError, NotFoundError
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.local_blobs import blob_path
from aiinfra_pipelines.lake.port import UploadHandle

HOSTILE_IDS = [
    "../objects",
    "../../../victim",
    "/etc",
    "..",
    "",
    "0" * 31,
    "0" * 32 + "/..",
    "A" * 32,
    "g" * 32,
    "0" * 32 + "\x00",
]


@pytest.fixture
def lake(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    lake.put_object("main", "kept.txt", b"committed before the attack")
    lake.commit("main", "a committed object")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("outside the lake")
    return lake


@pytest.mark.parametrize("upload_id", HOSTILE_IDS)
def test_a_crafted_upload_id_is_refused_everywhere_and_deletes_nothing(lake, tmp_path, upload_id):
    handle = UploadHandle(branch="main", key="logs/a.mcap", upload_id=upload_id)
    for call in (
        lambda: lake.abort_upload(handle),
        lambda: lake.upload_part(handle, 1, b"x"),
        lambda: lake.uploaded_parts(handle),
        lambda: lake.complete_upload(handle, {1: "x"}),
    ):
        with pytest.raises(InvalidKeyError, match="invalid upload id"):
            call()
    assert lake.get_object("main", "kept.txt") == b"committed before the attack"
    assert (tmp_path / "victim" / "precious").read_text() == "outside the lake"


def test_an_abort_removes_only_the_upload_it_names(lake):
    mine = lake.begin_upload("main", "logs/mine.mcap")
    lake.upload_part(mine, 1, b"part one")
    other = UploadHandle(branch="main", key="logs/theirs.mcap", upload_id=mine.upload_id)
    with pytest.raises(NotFoundError, match=r"not main:logs/theirs\.mcap"):
        lake.abort_upload(other)  # someone else's upload: refused, kept
    assert list(lake.uploaded_parts(mine)) == [1]  # still open
    lake.abort_upload(mine)
    lake.abort_upload(mine)  # already gone: no error (S3 semantics)
    unknown = UploadHandle(branch="main", key="logs/x.mcap", upload_id="0" * 32)
    lake.abort_upload(unknown)


def test_a_content_name_that_is_not_a_sha256_never_becomes_a_path(tmp_path):
    with pytest.raises(LakeError, match="not a sha256"):
        blob_path(tmp_path, "../../etc/passwd")
    assert blob_path(tmp_path, "ab" * 32).parent.name == "ab"
