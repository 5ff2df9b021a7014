"""Trigger proposals: weak slices and badcase clusters → condition rules with expected yield.

The index here is a hand-built scene index (the columns ingest writes that proposals read), so
every figure below can be worked out by hand: the built-in ``fog`` rule keeps 4 s of every
10 s of fog (duty 0.4); 40 kept night/fog/merge frames therefore mean ~100 driven, all of
which the proposed rule (4 s window every 4 s, duty 1) keeps.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.curation.query import query_frame
from aiinfra_pipelines.curation.trigger_proposals import (
    ProposalSettings,
    TriggerProposalError,
    badcase_clusters,
    condition_expression,
    driven_hours_by_branch,
    next_version,
    propose_trigger_config,
    slice_yield_by_version,
    weak_slices,
)
from aiinfra_pipelines.fleet.triggers import (
    ConditionSpec,
    FrameContext,
    TriggerConfig,
    evaluate_triggers,
)
from aiinfra_pipelines.logs.model import Frame
from aiinfra_pipelines_tests.support.trigger_index import slice_rows

BASE = "triggers-2"


@pytest.fixture(scope="module")
def index() -> pd.DataFrame:
    return pd.concat(
        [
            slice_rows("night/fog/merge", 4, 10),  # 40 frames, fog rule duty 0.4
            slice_rows("day/clear/highway", 10, 20),  # 200 frames, event rules only
            slice_rows("night/clear/highway", 6, 10),  # 60 frames, night rule duty 0.4
        ],
        ignore_index=True,
    )


def settings(**changes) -> ProposalSettings:
    config = copy.deepcopy(load_resource_yaml("triggers.yaml"))
    config["proposals"].update(changes)
    return ProposalSettings.load(config)


METRICS = {"night/fog/merge": 0.61, "day/clear/highway": 0.93, "night/clear/highway": 0.8}


def test_the_proposal_targets_the_weak_slice_with_its_expected_yield(index) -> None:
    proposal = propose_trigger_config(
        load_resource_yaml("triggers.yaml"),
        index,
        METRICS,
        driven_hours=2.0,
        settings=settings(worst_k=1, metric_below=0.7),
    )
    assert proposal is not None and proposal.version == "triggers-3"
    assert proposal.base_version == BASE
    (rule,) = proposal.rules
    assert rule.slice == "night/fog/merge" and "0.610 < 0.7" in rule.reason
    assert rule.expression == "lighting=night AND weather=fog AND road_type=merge"
    assert query_frame(index, rule.expression).matched == 40
    y = rule.expected_yield
    assert (y.kept_frames, y.kept_segments, y.index_frames) == (40, 4, 300)
    assert (y.duty_before, y.duty_expected) == (0.4, 1.0)
    assert (y.frames_per_hour, y.expected_frames_per_hour) == (20.0, 50.0)
    assert (y.segments_per_hour, y.expected_segments_per_hour) == (2.0, 5.0)
    assert y.share == round(40 / 300, 4) and y.expected_share == round(100 / 360, 4)

    # The document is what a car loads: every old rule, the new condition rule, the new
    # version, and none of the cloud-side proposal settings.
    config = TriggerConfig.load(config=proposal.config)
    assert config.version == "triggers-3" and "proposals" not in proposal.config
    assert set(TriggerConfig.load().rules) < set(config.rules)
    new = config.rules[rule.name]
    assert new.condition is not None and condition_expression(new.condition) == rule.expression
    table = proposal.yield_table()
    assert list(table["slice"]) == ["night/fog/merge"]
    assert table.loc[0, "expected_frames_per_hour"] == 50.0


def test_badcase_clusters_are_targeted_and_uncovered_slices_are_a_lower_bound(index) -> None:
    badcases = pd.concat(
        [
            index[index["slice"] == "night/clear/highway"].head(30),  # 50 % of 60: a cluster
            index[index["slice"] == "day/clear/highway"].head(30),  # 15 % of 200: not one
        ]
    )
    clusters = badcase_clusters(index, badcases, settings())
    assert list(clusters["slice"]) == ["night/clear/highway"]
    assert clusters.loc[0, "badcase_rate"] == 0.5

    proposal = propose_trigger_config(
        load_resource_yaml("triggers.yaml"),
        index,
        {"day/clear/highway": 0.5},
        driven_hours=1.0,
        badcases=badcases,
        settings=settings(worst_k=1),
    )
    assert proposal is not None
    by_slice = {rule.slice: rule for rule in proposal.rules}
    assert list(by_slice) == ["day/clear/highway", "night/clear/highway"]
    assert "badcase cluster: 30 of 60" in by_slice["night/clear/highway"].reason
    uncovered = by_slice["day/clear/highway"].expected_yield
    assert uncovered.duty_before is None and uncovered.basis.startswith("lower bound")
    assert uncovered.expected_frames == uncovered.kept_frames == 200


def test_an_engine_that_flags_every_frame_makes_no_cluster(index) -> None:
    """Model zero marks every frame low-confidence: each slice then sits at 100 %, which says
    nothing about where the model is weak, so no slice stands out enough to be a cluster."""
    assert badcase_clusters(index, index, settings()).empty
    # Half of every slice flagged, all of one: that one stands out.
    flagged = pd.concat([index.iloc[::2], index[index["slice"] == "night/clear/highway"]])
    clusters = badcase_clusters(index, flagged, settings())
    assert list(clusters["slice"]) == ["night/clear/highway"]
    assert clusters.loc[0, "badcase_rate"] == 1.0 and clusters.loc[0, "lift"] >= 1.5


def test_nothing_to_propose_and_rules_already_run_are_skipped(index) -> None:
    current = load_resource_yaml("triggers.yaml")
    none_weak = propose_trigger_config(
        current, index, METRICS, driven_hours=1.0, settings=settings(metric_below=0.5)
    )
    assert none_weak is None
    first = propose_trigger_config(
        current, index, METRICS, driven_hours=1.0, settings=settings(worst_k=1)
    )
    assert first is not None
    again = propose_trigger_config(
        first.config, index, METRICS, driven_hours=1.0, settings=settings(worst_k=1)
    )
    assert again is None  # the fleet already runs a rule for its only weak slice


def test_weak_slices_skip_unmeasured_ones_and_versions_are_never_reused() -> None:
    metrics = {"a/b/c": None, "d/e/f": 0.9, "g/h/i": 0.7, "j/k/l": 0.8}
    assert weak_slices(metrics, settings(worst_k=2)) == [("g/h/i", 0.7), ("j/k/l", 0.8)]
    assert weak_slices(metrics, settings(worst_k=5, metric_below=0.75)) == [("g/h/i", 0.7)]
    assert next_version("triggers-2") == "triggers-3"
    assert next_version("triggers-2", ["triggers-3", "triggers-5", "other-9"]) == "triggers-6"
    with pytest.raises(TriggerProposalError, match="does not end in a number"):
        next_version("triggers")


def test_slice_yield_by_version_uses_the_rows_and_driven_hours_of_each_version() -> None:
    index = pd.concat(
        [
            slice_rows("night/fog/merge", 2, 10, version="triggers-2", branch="one"),
            slice_rows("day/clear/highway", 3, 20, version="triggers-2", branch="one"),
            slice_rows("night/fog/merge", 5, 10, version="triggers-3", branch="two"),
            slice_rows("day/clear/highway", 3, 10, version="triggers-3", branch="two"),
        ],
        ignore_index=True,
    )
    telemetry = pd.DataFrame(
        {"batch_id": ["ingest-one", "ingest-one", "ingest-two"], "frames": [9000, 9000, 36000]}
    )
    hours = driven_hours_by_branch(telemetry, frame_rate_hz=5.0)
    assert hours == {"ingest-one": 1.0, "ingest-two": 2.0}
    table = slice_yield_by_version(index, "night/fog/merge", hours).set_index(
        "trigger_config_version"
    )
    assert table.loc["triggers-2", "slice_frames"] == 20 and table.loc["triggers-2", "frames"] == 80
    assert table.loc["triggers-3", "slice_frames"] == 50 and table.loc["triggers-3", "frames"] == 80
    assert table.loc["triggers-2", "share"] == 0.25 and table.loc["triggers-3", "share"] == 0.625
    assert table.loc["triggers-2", "slice_frames_per_hour"] == 20.0
    assert table.loc["triggers-3", "slice_frames_per_hour"] == 25.0

    # A pull answered in batch two from a car's cache was recorded under triggers-2: its frames
    # count for triggers-2, batch two's driven hours do not (the cars drove it under triggers-3).
    pulled = slice_rows("night/fog/merge", 1, 10, version="triggers-2", branch="two")
    with_pull = slice_yield_by_version(
        pd.concat([index, pulled], ignore_index=True), "night/fog/merge", hours
    ).set_index("trigger_config_version")
    assert with_pull.loc["triggers-2", "slice_frames"] == 30
    assert with_pull.loc["triggers-2", "driven_hours"] == 1.0
    assert with_pull.loc["triggers-2", "slice_frames_per_hour"] == 30.0
    assert with_pull.loc["triggers-3", "slice_frames_per_hour"] == 25.0


BAD_RULES = [
    ({"kind": "threshold", "when": {"weather": ["fog"]}}, "unknown kind 'threshold'"),
    ({"kind": "condition"}, "needs a non-empty `when`"),
    ({"kind": "condition", "when": {"season": ["winter"]}}, "unknown condition 'season'"),
    ({"kind": "condition", "when": {"weather": []}}, "non-empty list"),
    (
        {"kind": "condition", "when": {"weather": "fog"}, "bounds": {"altitude": {"min": 1}}},
        "cannot bound 'altitude'",
    ),
    (
        {
            "kind": "condition",
            "when": {"weather": "fog"},
            "bounds": {"speed_mps": {"min": 9, "max": 3}},
        },
        "min 9.0 > max 3.0",
    ),
    ({"kind": "condition", "when": {"weather": "fog"}, "colour": 1}, "unknown key"),
]


@pytest.mark.parametrize(("rule", "message"), BAD_RULES)
def test_a_bad_condition_rule_is_refused_with_its_name(rule: dict, message: str) -> None:
    config = copy.deepcopy(load_resource_yaml("triggers.yaml"))
    config["rules"]["fog_merge"] = {"pre_s": 0.0, "post_s": 4.0, **rule}
    with pytest.raises(ValueError, match=message) as error:
        TriggerConfig.load(config=config)
    assert "fog_merge" in str(error.value)


def test_a_condition_rule_may_not_shadow_a_built_in_rule() -> None:
    config = copy.deepcopy(load_resource_yaml("triggers.yaml"))
    config["rules"]["fog"] = {
        "kind": "condition",
        "when": {"weather": "fog"},
        "pre_s": 0,
        "post_s": 1,
    }
    with pytest.raises(ValueError, match="shadows the built-in rule"):
        TriggerConfig.load(config=config)


def test_the_expression_of_a_bounded_rule_selects_what_the_rule_bounds(index) -> None:
    spec = ConditionSpec(
        when={"weather": frozenset({"fog", "rain"}), "road_type": frozenset({"merge"})},
        bounds={"speed_mps": (22.0, 25.0)},
    )
    expression = condition_expression(spec)
    assert expression == (
        "(weather=fog OR weather=rain) AND road_type=merge AND speed_mps>=22.0 AND speed_mps<=25.0"
    )
    assert query_frame(index, expression).matched == 4 * 4  # frames 2..5 of each fog/merge log


def test_the_car_fires_a_bounded_rule_on_exactly_the_frames_its_expression_selects() -> None:
    config = copy.deepcopy(load_resource_yaml("triggers.yaml"))
    config["rules"] = {
        "fast_fog_merge": {
            "kind": "condition",
            "when": {"weather": ["fog"], "road_type": "merge"},
            "bounds": {"speed_mps": {"min": 15.0, "max": 28.0}},
            "pre_s": 0.0,
            "post_s": 0.0,
        }
    }
    rules = TriggerConfig.load(config=config)
    speeds = [10.0, 15.0, 22.0, 28.0, 31.0, 20.0]
    image = np.zeros((2, 2, 3), np.uint8)
    frames = [
        Frame(i * 200_000_000, image, 0.0, 0.0, 0.0, 0.0, 0.0, v, 0.0, 0.0, 0.0)
        for i, v in enumerate(speeds)
    ]
    fog_merge = FrameContext(weather="fog", lighting="day", road_type="merge")
    fired = [e.timestamp_ns // 200_000_000 for e in evaluate_triggers(frames, fog_merge, rules)]
    assert fired == [1, 2, 3, 5]
    elsewhere = FrameContext(weather="fog", lighting="day", road_type="highway")
    assert evaluate_triggers(frames, elsewhere, rules) == []

    index = pd.DataFrame(
        {"weather": "fog", "lighting": "day", "road_type": "merge", "speed_mps": speeds}
    )
    rule = rules.rules["fast_fog_merge"]
    assert rule.condition is not None
    selected = query_frame(index, condition_expression(rule.condition)).rows
    assert list(selected["speed_mps"]) == [speeds[i] for i in fired]
