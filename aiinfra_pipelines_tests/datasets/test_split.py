"""Train/val splits: by log, stratified by slice, deterministic."""

from __future__ import annotations

import pandas as pd
import pytest

from aiinfra_pipelines.datasets.split import (
    SplitLeakageError,
    assert_disjoint_logs,
    split_by_log,
)

MIXED = {
    "day/clear/highway": 7,
    "night/rain/merge": 2,
    "night/fog/roundabout": 3,
    "day/rain/intersection": 1,
    "day/fog/highway": 1,
    "night/clear/intersection": 1,
    "day/clear/merge": 12,
}


def _splits_per_log(df: pd.DataFrame) -> pd.Series:
    return df.groupby("log_id")["split"].nunique()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("val_fraction", [0.1, 0.2, 0.5, 0.9])
def test_no_log_in_two_splits_and_every_multi_log_slice_in_both(
    frames_factory, seed: int, val_fraction: float
) -> None:
    frames = frames_factory(MIXED)
    result = split_by_log(frames, val_fraction, seed)

    assert len(result) == len(frames)
    assert set(result["split"]) <= {"train", "val"}
    assert (_splits_per_log(result) == 1).all()
    assert_disjoint_logs(result)
    for slice_, n_logs in MIXED.items():
        splits = set(result.loc[result["slice"] == slice_, "split"])
        if n_logs >= 2:
            assert splits == {"train", "val"}, (slice_, seed, val_fraction)


def test_fleet_split_is_disjoint_and_stratified(fleet: pd.DataFrame) -> None:
    for seed in range(5):
        result = split_by_log(fleet, 0.2, seed)
        assert (_splits_per_log(result) == 1).all()
        logs_per_slice = fleet.groupby("slice")["log_id"].nunique()
        for slice_ in logs_per_slice[logs_per_slice >= 2].index:
            assert set(result.loc[result["slice"] == slice_, "split"]) == {"train", "val"}
        # The frame content travels unchanged; only a column is added.
        pd.testing.assert_frame_equal(result.drop(columns="split"), fleet)


def test_val_share_follows_fraction_per_slice(frames_factory) -> None:
    result = split_by_log(frames_factory({"day/clear/merge": 10, "night/fog/highway": 5}), 0.2, 0)
    val_logs = result.loc[result["split"] == "val"].groupby("slice")["log_id"].nunique()
    assert val_logs.to_dict() == {"day/clear/merge": 2, "night/fog/highway": 1}


def test_single_log_slices_are_pooled_and_split_by_fraction(frames_factory) -> None:
    singles = {f"day/{w}/{r}": 1 for w in ("clear", "rain") for r in ("merge", "highway", "x")}
    result = split_by_log(frames_factory(singles), 0.5, 3)
    assert result.groupby("split")["log_id"].nunique().to_dict() == {"train": 3, "val": 3}


def test_deterministic_and_independent_of_row_order(frames_factory) -> None:
    frames = frames_factory(MIXED)
    first = split_by_log(frames, 0.3, 42)
    again = split_by_log(frames, 0.3, 42)
    shuffled = split_by_log(frames.sample(frac=1.0, random_state=1), 0.3, 42)

    def assignment(df: pd.DataFrame) -> dict[str, str]:
        return df.drop_duplicates("log_id").set_index("log_id")["split"].to_dict()

    assert assignment(first) == assignment(again) == assignment(shuffled)
    others = [assignment(split_by_log(frames, 0.3, seed)) for seed in range(5)]
    assert any(other != assignment(first) for other in others), "the seed must matter"


def test_adding_a_slice_does_not_reshuffle_existing_slices(frames_factory) -> None:
    base = {"day/clear/merge": 12, "night/fog/roundabout": 3}
    before = split_by_log(frames_factory(base), 0.25, 7)
    after = split_by_log(frames_factory({**base, "night/rain/highway": 6}), 0.25, 7)
    old = after.loc[after["slice"].isin(list(base))].reset_index(drop=True)
    assert old["split"].tolist() == before["split"].tolist()


def test_assert_disjoint_logs_names_the_leaking_log() -> None:
    leaking = pd.DataFrame(
        {"log_id": ["a", "a", "b", "c"], "split": ["train", "val", "train", "val"]}
    )
    with pytest.raises(SplitLeakageError, match=r"1 log\(s\).*a in \['train', 'val'\]"):
        assert_disjoint_logs(leaking)
    assert_disjoint_logs(leaking.iloc[1:])  # without the duplicate it is fine


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_rejects_degenerate_fractions(frames_factory, fraction: float) -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        split_by_log(frames_factory({"day/clear/merge": 3}), fraction, 0)
