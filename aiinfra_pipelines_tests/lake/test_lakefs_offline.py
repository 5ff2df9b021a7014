"""LakeFSLake without a server: the SDK calls it makes and how it translates SDK errors.

The real behaviour against lakeFS is covered by the contract suite when ``LAKEFS_ENDPOINT`` is
set; these tests pin the adapter's own logic (diff orientation, error mapping, client-side
``stop_at``, conflict naming) by replacing the SDK's HTTP-level methods.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import lakefs_sdk
import pytest
from lakefs import exceptions as lakefs_exc
from lakefs.branch import Branch
from lakefs.models import Change, Commit
from lakefs.object import StoredObject
from lakefs.reference import Reference

from aiinfra_pipelines.lake import (
    LakeError,
    LakeFSLake,
    MergeConflictError,
    NotFoundError,
    NothingToCommitError,
    ObjectStat,
)


@pytest.fixture
def lake() -> LakeFSLake:
    return LakeFSLake(
        repository="drive-data",
        endpoint="http://lakefs.invalid:8000",
        access_key_id="AKIA-TEST",
        secret_access_key="secret",
    )


def _commit(cid: str, parents: list[str]) -> Commit:
    return Commit(
        id=cid,
        parents=parents,
        committer="ci",
        message=f"msg {cid}",
        creation_date=1_700_000_000,
        meta_range_id="",
        metadata={"k": cid},
    )


def test_client_is_lazy_and_not_pickled(lake: LakeFSLake) -> None:
    assert lake.client.config.host.startswith("http://lakefs.invalid:8000")
    clone = pickle.loads(pickle.dumps(lake))
    assert clone._client is None
    assert clone.endpoint == lake.endpoint
    assert clone.client is not lake.client


def test_diff_resolves_refs_and_asks_for_two_dot(lake: LakeFSLake, monkeypatch) -> None:
    calls: list[tuple[str, str, dict]] = []
    monkeypatch.setattr(
        Reference, "get_commit", lambda self: SimpleNamespace(id=f"commit-of-{self.id}")
    )

    def fake_diff(self, other_ref, **kwargs):
        calls.append((self.id, other_ref, kwargs))
        yield Change(type="removed", path="z.txt", path_type="object", size_bytes=3)
        yield Change(type="added", path="a.txt", path_type="object", size_bytes=1)
        yield Change(type="prefix_changed", path="dir/", path_type="common_prefix", size_bytes=None)

    monkeypatch.setattr(Reference, "diff", fake_diff)
    entries = lake.diff("main", "feature", prefix="")
    assert [(e.key, e.type, e.size) for e in entries] == [
        ("a.txt", "added", 1),
        ("z.txt", "removed", 3),
    ]
    assert calls[0][0] == "commit-of-main", "left is resolved to a commit: no staged changes"
    assert calls[0][1] == "commit-of-feature"
    assert calls[0][2]["type"] == "two_dot"
    lake.diff("main", "feature", three_dot=True)
    assert calls[1][2]["type"] == "three_dot"


def test_commit_without_changes_maps_to_nothing_to_commit(lake: LakeFSLake, monkeypatch) -> None:
    def no_changes(self, message, metadata=None, **kwargs):
        raise lakefs_exc.BadRequestException(
            400, "Bad Request", b'{"message":"commit: no changes"}'
        )

    monkeypatch.setattr(Branch, "commit", no_changes)
    with pytest.raises(NothingToCommitError, match="main"):
        lake.commit("main", "nothing")


def test_missing_object_maps_to_not_found(lake: LakeFSLake, monkeypatch) -> None:
    def missing(self, *args, **kwargs):
        raise lakefs_exc.ObjectNotFoundException(404, "Not Found")

    monkeypatch.setattr(StoredObject, "reader", missing)
    with pytest.raises(NotFoundError, match=r"missing\.txt"):
        lake.get_object("main", "missing.txt")


def test_raw_sdk_api_errors_are_translated(lake: LakeFSLake, monkeypatch) -> None:
    def boom(self, *args, **kwargs):
        raise lakefs_sdk.ApiException(status=500, reason="Internal Server Error")

    monkeypatch.setattr(StoredObject, "stat", boom)
    with pytest.raises(LakeError, match="500"):
        lake.stat_object("main", "a.txt")


def test_log_applies_stop_at_and_limit_client_side(lake: LakeFSLake, monkeypatch) -> None:
    history = [_commit("c3", ["c2"]), _commit("c2", ["c1"]), _commit("c1", ["c0"])]
    history.append(_commit("c0", []))
    monkeypatch.setattr(Reference, "log", lambda self, max_amount=None, **kw: iter(history))
    assert [c.id for c in lake.log("main", stop_at="c1")] == ["c3", "c2"]
    assert [c.id for c in lake.log("main", limit=3)] == ["c3", "c2", "c1"]
    newest = lake.log("main", limit=1)[0]
    assert newest.metadata == {"k": "c3"}
    assert newest.created_at.year == 2023 and newest.created_at.tzinfo is not None


def test_merge_conflict_names_the_conflicting_keys(lake: LakeFSLake, monkeypatch) -> None:
    monkeypatch.setattr(LakeFSLake, "uncommitted", lambda self, branch: [])
    monkeypatch.setattr(LakeFSLake, "resolve_ref", lambda self, ref: f"id-{ref}")
    monkeypatch.setattr(
        lakefs_sdk.RefsApi,
        "find_merge_base",
        lambda self, repo, src, dst: lakefs_sdk.FindMergeBaseResult(
            source_commit_id=src, destination_commit_id="id-main", base_commit_id="id-base"
        ),
    )

    def conflict(self, destination_branch, **kwargs):
        raise lakefs_exc.ConflictException(409, "Conflict", b'{"message":"conflict found"}')

    monkeypatch.setattr(Reference, "merge_into", conflict)
    from aiinfra_pipelines.lake.port import DiffEntry

    side = {
        "id-relabel": [
            DiffEntry("both-removed.json", "removed", 1),
            DiffEntry("changed.json", "changed", 2),
            DiffEntry("same.json", "changed", 2),
            DiffEntry("source-only.json", "added", 2),
        ],
        "id-main": [
            DiffEntry("both-removed.json", "removed", 1),
            DiffEntry("changed.json", "changed", 2),
            DiffEntry("same.json", "changed", 2),
        ],
    }
    monkeypatch.setattr(LakeFSLake, "diff", lambda self, left, right, **kw: side[right])
    checksums = {("id-relabel", "changed.json"): "x", ("id-main", "changed.json"): "y"}
    monkeypatch.setattr(
        LakeFSLake,
        "stat_object",
        lambda self, ref, key: ObjectStat(key, 2, checksums.get((ref, key), "same")),
    )
    with pytest.raises(MergeConflictError) as caught:
        lake.merge("relabel", "main")
    assert caught.value.conflicts == ["changed.json"]


def test_merge_of_an_already_merged_source_returns_destination_head(
    lake: LakeFSLake, monkeypatch
) -> None:
    monkeypatch.setattr(LakeFSLake, "uncommitted", lambda self, branch: [])
    monkeypatch.setattr(LakeFSLake, "resolve_ref", lambda self, ref: "id-src")
    monkeypatch.setattr(
        lakefs_sdk.RefsApi,
        "find_merge_base",
        lambda self, repo, src, dst: lakefs_sdk.FindMergeBaseResult(
            source_commit_id="id-src", destination_commit_id="id-main", base_commit_id="id-src"
        ),
    )
    monkeypatch.setattr(Reference, "merge_into", lambda *a, **k: pytest.fail("must not merge"))
    assert lake.merge("ingest-1", "main") == "id-main"


def test_repository_creation_needs_a_storage_namespace(lake: LakeFSLake, monkeypatch) -> None:
    def missing_repo(self, *args, **kwargs):
        raise lakefs_sdk.ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(lakefs_sdk.RepositoriesApi, "get_repository", missing_repo)
    with pytest.raises(LakeError, match="storage_namespace"):
        lake.ensure_repository()
