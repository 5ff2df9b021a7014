"""The MLflow Model Registry helpers on a temporary sqlite store."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.release.registry import (
    CANDIDATE_ALIAS,
    PRODUCTION_ALIAS,
    ModelRegistry,
    RegistryError,
    record_certification,
    record_refusal,
    registered_model_name,
)
from aiinfra_pipelines_tests.support.release_lake import mlflow_uri, register_versions


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> ModelRegistry:
    uri = mlflow_uri(tmp_path_factory.mktemp("registry"))
    register_versions(uri, 3)
    return ModelRegistry(uri)


def test_the_registered_model_name_comes_from_training_yaml(registry):
    assert registered_model_name() == "perception" == registry.name


def test_tags_are_set_read_and_deleted_per_version(registry):
    registry.set_tags("1", {"dataset_commit": "abc", "engine_bytes": 123})
    registry.tag("1", "code_version", "deadbeef")

    tags = registry.version_tags("1")
    assert tags["dataset_commit"] == "abc" and tags["engine_bytes"] == "123"
    assert tags["code_version"] == "deadbeef"
    assert "dataset_commit" not in registry.version_tags("2")
    registry.delete_tag("1", "code_version")
    registry.delete_tag("1", "never-set")  # no error
    assert "code_version" not in registry.version_tags("1")


def test_aliases_move_and_can_be_removed(registry):
    assert registry.get_alias(PRODUCTION_ALIAS) is None
    registry.set_alias(PRODUCTION_ALIAS, "1")
    registry.set_alias(PRODUCTION_ALIAS, "2")
    assert registry.get_alias(PRODUCTION_ALIAS) == "2"
    assert registry.version("2").aliases == [PRODUCTION_ALIAS]
    assert registry.version("1").aliases == []
    registry.delete_alias(PRODUCTION_ALIAS)
    registry.delete_alias(PRODUCTION_ALIAS)  # already gone: no error
    assert registry.get_alias(PRODUCTION_ALIAS) is None


def test_unknown_versions_and_aliases_are_clear_errors(registry):
    with pytest.raises(RegistryError, match=r"'perception' v9 is not in the registry"):
        registry.set_tags("9", {"a": "b"})
    with pytest.raises(RegistryError, match=r"v9 is not in the registry"):
        registry.set_alias(CANDIDATE_ALIAS, "9")
    with pytest.raises(RegistryError, match="'champion' is not a release alias"):
        registry.set_alias("champion", "1")


def test_refusal_then_certification_of_the_same_version(registry):
    registry.set_alias(CANDIDATE_ALIAS, "3")

    record_refusal(registry, "3", ["engine_parity", "regression_simulation"], "refused: ...")
    tags = registry.version_tags("3")
    assert tags["certification"] == "refused"
    assert tags["certification_failed_gates"] == "engine_parity,regression_simulation"
    assert registry.get_alias(CANDIDATE_ALIAS) is None, "a refused version keeps no alias"

    certificate = {
        "model_version": "3",
        "certificate_sha256": "c" * 64,
        "certificate_key": "candidates/3/certificate.json",
        "key_id": "k" * 64,
        "onnx": {"sha256": "o" * 64},
        "engine": {"sha256": "e" * 64},
        "reports": {"engine_parity": {"sha256": "p" * 64}},
    }
    record_certification(registry, certificate)
    tags = registry.version_tags("3")
    assert tags["certification"] == "passed"
    assert tags["report_engine_parity_sha256"] == "p" * 64
    assert "certification_failed_gates" not in tags and "certification_refusal" not in tags
    assert registry.get_alias(CANDIDATE_ALIAS) == "3"
