"""The shared lake helpers: encodings, read helpers on the port, and ``commit_changes``."""

import json

import pandas as pd
import pytest

from aiinfra_pipelines.lake.encoding import canonical_json, json_document
from aiinfra_pipelines.lake.errors import NothingToCommitError
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.publish import commit_changes, publish_with_run_branch


def test_canonical_json_is_the_frozen_signing_form():
    # Certificates on the lake were signed over exactly these bytes: never change them.
    body = {"b": [1, 2], "a": "é", "c": {"y": None, "x": True}}
    assert canonical_json(body) == '{"a":"é","b":[1,2],"c":{"x":true,"y":null}}'.encode()


def test_json_document_is_sorted_indented_and_parses_back():
    data = json_document({"b": 1, "a": {"d": "é"}})
    assert data == '{\n  "a": {\n    "d": "é"\n  },\n  "b": 1\n}\n'.encode()
    assert json.loads(data) == {"a": {"d": "é"}, "b": 1}


def test_put_json_stores_the_document_form(local_lake):
    local_lake.ensure_repository()
    local_lake.put_json(MAIN_BRANCH, "x.json", {"z": 1, "a": 2})
    assert local_lake.get_object(MAIN_BRANCH, "x.json") == json_document({"a": 2, "z": 1})


def test_get_json_or_none_and_get_parquet(local_lake):
    local_lake.ensure_repository()
    assert local_lake.get_json_or_none(MAIN_BRANCH, "missing.json") is None
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    local_lake.put_object(MAIN_BRANCH, "t.parquet", parquet_bytes(frame))
    local_lake.put_json(MAIN_BRANCH, "p.json", {"k": "v"})
    assert local_lake.get_json_or_none(MAIN_BRANCH, "p.json") == {"k": "v"}
    pd.testing.assert_frame_equal(local_lake.get_parquet(MAIN_BRANCH, "t.parquet"), frame)
    assert list(local_lake.get_parquet(MAIN_BRANCH, "t.parquet", columns=["b"]).columns) == ["b"]


def test_commit_changes_puts_and_deletes_in_one_commit(local_lake):
    local_lake.ensure_repository()
    local_lake.create_branch("work")
    local_lake.put_object("work", "old", b"o")
    local_lake.commit("work", "seed")
    seen = []
    commit = commit_changes(
        local_lake,
        "work",
        "act",
        {"kind": "test"},
        puts={"a": b"1", "b": b"2"},
        deletes=["old", "never-there"],
        on_put=seen.append,
    )
    assert seen == [1, 2]
    assert local_lake.resolve_ref("work") == commit
    head = local_lake.log("work", limit=1)[0]
    assert (head.message, head.metadata) == ("act", {"kind": "test"})
    assert sorted(s.key for s in local_lake.list_objects(commit)) == ["a", "b"]
    # An empty act still records a commit by default, and raises when asked to.
    assert commit_changes(local_lake, "work", "again", {}) != commit
    with pytest.raises(NothingToCommitError):
        commit_changes(local_lake, "work", "again", {}, allow_empty=False)


def test_publish_with_run_branch_deletes_in_the_same_merge(local_lake):
    local_lake.ensure_repository()
    local_lake.put_object(MAIN_BRANCH, "release/production.json", b"p")
    local_lake.commit(MAIN_BRANCH, "pointer")
    publish_with_run_branch(
        local_lake,
        "root-1",
        {"release/rollout/1.json": b"s"},
        "rollback",
        {},
        deletes=["release/production.json"],
    )
    keys = [s.key for s in local_lake.list_objects(MAIN_BRANCH)]
    assert "release/rollout/1.json" in keys and "release/production.json" not in keys
