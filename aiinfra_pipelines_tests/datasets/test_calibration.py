"""The calibration sample: representative, every slice, every minimum share from gates.yaml."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from aiinfra_pipelines.datasets.calibration import (
    CalibrationCoverageError,
    coverage_report,
    select_calibration_set,
)
from aiinfra_pipelines.datasets.settings import CalibrationGates
from aiinfra_pipelines_tests.support.dataset_frames import make_frames


@pytest.fixture(scope="module")
def gates() -> tuple[int, dict[str, dict[str, float]]]:
    gates = CalibrationGates.load()
    return gates.samples, gates.min_share


def _assert_meets(sample: pd.DataFrame, min_share: dict[str, dict[str, float]]) -> None:
    for dimension, shares in min_share.items():
        for value, share in shares.items():
            count = int((sample[dimension] == value).sum())
            assert count >= math.ceil(share * len(sample) - 1e-9), (dimension, value, count)


def test_fleet_sample_meets_every_share_and_covers_every_slice(fleet, gates) -> None:
    samples, min_share = gates
    sample = select_calibration_set(fleet, samples, min_share, seed=0)

    assert len(sample) == samples
    assert not sample.duplicated(["log_id", "frame_index"]).any()
    assert set(sample["slice"]) == set(fleet["slice"])
    _assert_meets(sample, min_share)
    report = coverage_report(sample, min_share)
    assert report["meets_min_share"] and report["shortfalls"] == []
    assert report["samples"] == samples
    assert sum(report["slices"].values()) == samples
    assert report["logs"] == fleet["log_id"].nunique()  # spread over every drive

    again = select_calibration_set(fleet, samples, min_share, seed=0)
    pd.testing.assert_frame_equal(sample, again)
    other = select_calibration_set(fleet, samples, min_share, seed=1)
    assert not other[["log_id", "frame_index"]].equals(sample[["log_id", "frame_index"]])


def test_missing_rain_is_named(fleet, gates) -> None:
    samples, min_share = gates
    dry = fleet.loc[fleet["weather"] != "rain"]
    with pytest.raises(CalibrationCoverageError, match=r"weather=rain: no frames") as caught:
        select_calibration_set(dry, samples, min_share, seed=0)
    assert caught.value.condition == "weather=rain"


def test_insufficient_condition_is_named(fleet, gates) -> None:
    samples, min_share = gates
    night = fleet.index[fleet["lighting"] == "night"]
    scarce = fleet.drop(index=night[5:])  # 5 night frames where 39 are needed
    with pytest.raises(CalibrationCoverageError, match=r"lighting=night: only 5 frames"):
        select_calibration_set(scarce, samples, min_share, seed=0)


def test_quotas_lift_a_rare_condition_above_its_natural_share() -> None:
    # 2 of 40 logs are night (5 %): a uniform sample would hold ~5 % night, the gate asks 25 %.
    frames = make_frames({"day/clear/highway": 38, "night/clear/highway": 2}, frames_per_log=10)
    min_share = {"lighting": {"day": 0.25, "night": 0.25}}
    sample = select_calibration_set(frames, 60, min_share, seed=3)
    assert (sample["lighting"] == "night").sum() >= 15  # uniform sampling would give ~3
    assert sample.loc[sample["lighting"] == "night", "log_id"].nunique() == 2  # both night drives


def test_small_source_uses_every_frame() -> None:
    frames = make_frames({"day/clear/highway": 2, "night/rain/merge": 2})
    min_share = {"lighting": {"day": 0.4, "night": 0.4}}
    sample = select_calibration_set(frames, 1000, min_share, seed=0)
    assert len(sample) == len(frames)


def test_infeasible_shares_name_the_dimension() -> None:
    frames = make_frames({"day/clear/highway": 5, "night/rain/merge": 5})
    with pytest.raises(CalibrationCoverageError, match=r"^lighting: minimum shares add up"):
        select_calibration_set(frames, 10, {"lighting": {"day": 0.6, "night": 0.6}}, seed=0)


def test_coverage_report_lists_shortfalls() -> None:
    sample = make_frames({"day/clear/highway": 3})
    report = coverage_report(sample, {"lighting": {"day": 0.2, "night": 0.2}})
    assert report["shares"]["lighting"] == {"day": 1.0}
    assert report["shortfalls"] == ["lighting=night: 0.0% < 20%"]
    assert report["meets_min_share"] is False
