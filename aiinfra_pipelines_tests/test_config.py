"""``settings_section``: typed reads of ``resources/*.yaml`` whose errors name file and key."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.config import SettingsError, settings_section

CONFIG = {
    "engine": {
        "batch_size": "8",
        "threshold": 0.5,
        "ratio": "x",
        "enabled": "yes",
        "name": "onnx",
        "tags": ["a", "b"],
        "nested": {"depth": 2.0},
        "flag": True,
    }
}


def test_getters_coerce_values_the_yaml_spells_loosely():
    engine = settings_section("mining.yaml", "engine", CONFIG)
    assert engine.int("batch_size") == 8
    assert engine.float("threshold") == 0.5
    assert engine.bool("enabled") is True
    assert engine.str("name") == "onnx"
    assert engine.list("tags") == ["a", "b"]
    assert engine.section("nested").int("depth") == 2
    assert settings_section("mining.yaml", "engine.nested", CONFIG).int("depth") == 2


def test_defaults_apply_only_to_missing_keys():
    engine = settings_section("mining.yaml", "engine", CONFIG)
    assert engine.int("absent", 3) == 3
    assert engine.list("absent", None) == []
    with pytest.raises(SettingsError, match="expected a number"):
        engine.float("ratio", 1.0)


@pytest.mark.parametrize(
    ("read", "message"),
    [
        (
            lambda s: s.int("ratio"),
            "resources/mining.yaml: engine.ratio: expected an int, got 'x'",
        ),
        (
            lambda s: s.int("flag"),
            "resources/mining.yaml: engine.flag: expected an int, got True",
        ),
        (
            lambda s: s.float("ratio"),
            "resources/mining.yaml: engine.ratio: expected a number, got 'x'",
        ),
        (
            lambda s: s.bool("name"),
            "resources/mining.yaml: engine.name: expected true or false, got 'onnx'",
        ),
        (
            lambda s: s.str("tags"),
            "resources/mining.yaml: engine.tags: expected a string, got ['a', 'b']",
        ),
        (
            lambda s: s.list("name"),
            "resources/mining.yaml: engine.name: expected a list, got 'onnx'",
        ),
        (
            lambda s: s.int("missing"),
            "resources/mining.yaml: engine.missing: missing (required)",
        ),
        (
            lambda s: s.section("name"),
            "resources/mining.yaml: engine.name: expected a mapping, got 'onnx'",
        ),
        (
            lambda s: s.section("nested").int("width"),
            "resources/mining.yaml: engine.nested.width: missing (required)",
        ),
    ],
)
def test_errors_name_the_file_and_the_dotted_key(read, message):
    engine = settings_section("mining.yaml", "engine", CONFIG)
    with pytest.raises(SettingsError) as raised:
        read(engine)
    assert str(raised.value) == message


def test_a_missing_section_names_the_file_and_the_path():
    with pytest.raises(SettingsError, match=r"^resources/mining.yaml: pulls: missing"):
        settings_section("mining.yaml", "pulls", CONFIG)
    with pytest.raises(SettingsError, match=r"^resources/mining.yaml: engine.x.y: missing"):
        settings_section("mining.yaml", "engine.x.y", {"engine": {"x": {}}})


def test_errors_stay_catchable_as_the_key_and_value_errors_raw_reads_raised():
    engine = settings_section("mining.yaml", "engine", CONFIG)
    with pytest.raises(KeyError):
        engine.int("missing")
    with pytest.raises(ValueError):
        engine.int("ratio")


def test_without_config_the_file_under_resources_is_read():
    assert settings_section("training.yaml").section("trainer").str("accelerator")


def test_a_list_of_mappings_reads_as_sections_with_indexed_keys():
    config = {"rollout": {"stages": [{"name": "canary", "percent": 5}, {"name": "full"}]}}
    stages = settings_section("gates.yaml", "rollout", config).sections("stages")
    assert stages[0].float("percent") == 5.0
    with pytest.raises(SettingsError) as raised:
        stages[1].float("percent")
    assert (
        str(raised.value) == "resources/gates.yaml: rollout.stages[1].percent: missing (required)"
    )
    with pytest.raises(SettingsError, match=r"rollout.stages\[0\]: expected a mapping"):
        settings_section("gates.yaml", "rollout", {"rollout": {"stages": [3]}}).sections("stages")


def test_an_optional_section_may_be_null_and_a_fraction_is_no_int():
    config = {"demo": {"closing_drive": None, "cycles": 2.5}}
    demo = settings_section("demo.yaml", "demo", config)
    assert demo.section("closing_drive", {}).int("episodes", 0) == 0
    with pytest.raises(SettingsError, match=r"demo.cycles: expected an int, got 2.5"):
        demo.int("cycles")
