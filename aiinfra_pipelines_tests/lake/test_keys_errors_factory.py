"""Key/name validation, error types and adapter selection: the adapter-independent pieces."""

from __future__ import annotations

import pickle

import dagster as dg
import pytest

from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.lake import (
    InvalidKeyError,
    LakeError,
    LakeFSLake,
    LocalLake,
    MergeConflictError,
    validate_branch_name,
    validate_key,
    validate_prefix,
    validate_tag_name,
)


@pytest.mark.parametrize(
    "key", ["a.txt", "raw/2024-05-01/vin123/log.mcap", "a/.hidden/b", "ü/日本.json", "a..b/c"]
)
def test_valid_keys_pass_unchanged(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", "empty"),
        ("/abs", "relative"),
        ("a\\b", "backslash"),
        ("../x", r"'\.\.'"),
        ("a/./b", r"'\.'"),
        ("a//b", "empty path segment"),
        ("trailing/", "empty path segment"),
        ("tab\there", "control"),
        ("x" * 1025, "longer"),
        ("lone\ud800surrogate", "UTF-8"),
    ],
)
def test_invalid_keys_name_the_key_and_reason(key: str, reason: str) -> None:
    with pytest.raises(InvalidKeyError, match=reason) as caught:
        validate_key(key)
    assert repr(key)[:40] in str(caught.value)


def test_prefix_may_be_empty_or_end_with_slash() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("raw/") == "raw/"
    assert validate_prefix("raw/2024") == "raw/2024"
    with pytest.raises(InvalidKeyError):
        validate_prefix("raw//")
    with pytest.raises(InvalidKeyError):
        validate_prefix("../raw/")


def test_branch_names_follow_lakefs_rules() -> None:
    assert validate_branch_name("ingest-batch_0007") == "ingest-batch_0007"
    for bad in ["ingest/batch", "-leading", "", "has space", "dot.name", "ünï"]:
        with pytest.raises(InvalidKeyError, match="branch name"):
            validate_branch_name(bad)


def test_tag_names() -> None:
    assert validate_tag_name("dataset-v0007") == "dataset-v0007"
    assert validate_tag_name("v1.2") == "v1.2"
    for bad in ["", "a..b", "with/slash", ".dot"]:
        with pytest.raises(InvalidKeyError, match="tag name"):
            validate_tag_name(bad)


def test_merge_conflict_error_lists_keys_and_survives_pickling() -> None:
    error = MergeConflictError(["b.json", "a.json", "a.json"], "ingest-1", "main")
    assert error.conflicts == ["a.json", "b.json"]
    assert "a.json, b.json" in str(error)
    assert "'ingest-1' into 'main'" in str(error)
    assert isinstance(error, LakeError)
    clone = pickle.loads(pickle.dumps(error))
    assert clone.conflicts == error.conflicts
    assert str(clone) == str(error)


def test_local_environment_selects_local_lake_under_dagster_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LAKEFS_ENDPOINT", "http://lakefs.invalid:8000")  # not enough to switch
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    lake = build_lake(load_environment("local"))
    assert type(lake) is LocalLake
    assert lake.root_path() == tmp_path / "lake"


def test_prod_environment_builds_lakefs_lake_from_env_vars(monkeypatch) -> None:
    monkeypatch.setenv("LAKEFS_ENDPOINT", "http://lakefs.invalid:8000")
    monkeypatch.setenv("LAKEFS_ACCESS_KEY_ID", "AKIA-TEST")
    monkeypatch.setenv("LAKEFS_SECRET_ACCESS_KEY", "secret")
    lake = build_lake(load_environment("prod"))
    assert isinstance(lake, LakeFSLake)
    assert isinstance(lake.endpoint, dg.EnvVar)
    assert lake.endpoint.env_var_name == "LAKEFS_ENDPOINT"
    assert isinstance(lake.secret_access_key, dg.EnvVar), "secrets stay env references"
    # used directly (outside Definitions) the EnvVars are resolved when the client is built
    assert lake.client.config.host.startswith("http://lakefs.invalid:8000")
    assert lake.client.config.username == "AKIA-TEST"
