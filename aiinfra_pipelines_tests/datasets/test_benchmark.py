"""The benchmark set: held out per slice, frozen across data, changed only explicitly."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from aiinfra_pipelines.datasets.benchmark import (
    BenchmarkChangeError,
    benchmark_frames,
    benchmark_log_ids,
    exclude_benchmark,
    freeze_benchmark,
    select_benchmark_logs,
)
from aiinfra_pipelines.datasets.split import split_by_log
from aiinfra_pipelines_tests.support.dataset_frames import make_frames

PARAMS = {"fraction": 0.2, "seed": 0, "min_logs_per_slice": 1}
OLD = {"day/clear/highway": 6, "night/rain/merge": 3, "night/fog/roundabout": 1}
NEW = {"day/clear/highway": 10, "night/rain/merge": 5, "night/fog/roundabout": 4, "day/fog/x": 3}


def test_selection_per_slice_respects_fraction_minimum_and_keeps_training_logs() -> None:
    frames = make_frames({"a/b/c": 10, "a/b/d": 2, "a/b/e": 1, "a/b/f": 21})
    chosen = select_benchmark_logs(frames, 0.2, 0, 1)
    assert {s: len(logs) for s, logs in chosen.items()} == {"a/b/c": 2, "a/b/d": 1, "a/b/f": 4}
    for slice_, logs in chosen.items():
        slice_logs = set(frames.loc[frames["slice"] == slice_, "log_id"])
        assert set(logs) < slice_logs  # held out, and at least one log left to train on
    assert "a/b/e" not in chosen  # a single log cannot be both trained on and held out
    assert chosen == select_benchmark_logs(frames.iloc[::-1], 0.2, 0, 1)  # deterministic


def test_selection_never_picks_logs_training_already_used() -> None:
    frames = make_frames({"a/b/c": 4})
    trained = ["a-b-c-log00", "a-b-c-log01", "a-b-c-log02"]
    assert select_benchmark_logs(frames, 0.5, 0, 1, exclude_logs=trained) == {
        "a/b/c": ["a-b-c-log03"]
    }


def test_creation_records_selection_and_uncovered_slices() -> None:
    manifest = freeze_benchmark(None, make_frames(OLD), **PARAMS)
    assert manifest["version"] == "benchmark-v0001"
    assert manifest["selection"] == PARAMS
    assert set(manifest["slices"]) == {"day/clear/highway", "night/rain/merge"}
    assert manifest["uncovered_slices"] == ["night/fog/roundabout"]
    assert manifest["logs"] == len(benchmark_log_ids(manifest)) == 2
    [change] = manifest["changes"]
    assert change["kind"] == "created" and change["added"] == manifest["slices"]


def test_freeze_keeps_existing_logs_and_only_covers_new_slices() -> None:
    first = freeze_benchmark(None, make_frames(OLD), **PARAMS)
    snapshot = copy.deepcopy(first)
    # Different selection parameters must not matter for slices already covered.
    second = freeze_benchmark(first, make_frames(NEW), fraction=0.5, seed=99)

    assert first == snapshot, "the input manifest must not be mutated"
    for slice_, logs in first["slices"].items():
        assert second["slices"][slice_] == logs
    assert set(second["slices"]) == {*first["slices"], "night/fog/roundabout", "day/fog/x"}
    assert second["uncovered_slices"] == []
    assert second["version"] == "benchmark-v0002"
    change = second["changes"][-1]
    assert change["kind"] == "extended"
    assert set(change["added"]) == {"night/fog/roundabout", "day/fog/x"}
    assert second["selection"]["seed"] == 99

    # Nothing new: the manifest comes back unchanged, version included.
    assert freeze_benchmark(second, make_frames(NEW)) == second


def test_freeze_needs_selection_parameters_somewhere() -> None:
    with pytest.raises(ValueError, match="fraction"):
        freeze_benchmark(None, make_frames(OLD), seed=0, min_logs_per_slice=1)


def test_membership_change_requires_a_reason_and_is_recorded() -> None:
    frames = make_frames(NEW)
    manifest = freeze_benchmark(None, frames, **PARAMS)
    victim = manifest["slices"]["day/clear/highway"][0]
    replacement = next(
        log
        for log in frames.loc[frames["slice"] == "day/clear/highway", "log_id"].unique()
        if log not in benchmark_log_ids(manifest)
    )
    for reason in (None, "", "   "):
        with pytest.raises(BenchmarkChangeError, match="reason"):
            freeze_benchmark(manifest, frames, remove_logs=[victim], reason=reason)

    changed = freeze_benchmark(
        manifest,
        frames,
        remove_logs=[victim],
        add_logs=[replacement],
        reason="label audit found a mislabelled lead vehicle",
    )
    assert victim not in benchmark_log_ids(changed)
    assert replacement in benchmark_log_ids(changed)
    assert changed["version"] == "benchmark-v0002"
    assert changed["retired_logs"] == [victim]
    last = changed["changes"][-1]
    assert last == {
        "version": "benchmark-v0002",
        "kind": "explicit",
        "reason": "label audit found a mislabelled lead vehicle",
        "added": {"day/clear/highway": [replacement]},
        "removed": {"day/clear/highway": [victim]},
    }
    assert changed["changes"][:-1] == manifest["changes"]


def test_removed_logs_are_not_picked_again_automatically() -> None:
    frames = make_frames({"a/b/c": 3})
    manifest = freeze_benchmark(None, frames, **PARAMS)
    [held] = manifest["slices"]["a/b/c"]
    emptied = freeze_benchmark(manifest, frames, remove_logs=[held], reason="drop it")
    assert emptied["slices"] == {}
    refilled = freeze_benchmark(emptied, frames)  # the slice is uncovered again
    [new] = refilled["slices"]["a/b/c"]
    assert new != held
    assert refilled["changes"][-1]["kind"] == "extended"


def test_inconsistent_explicit_changes_are_refused() -> None:
    frames = make_frames(OLD)
    manifest = freeze_benchmark(None, frames, **PARAMS)
    with pytest.raises(BenchmarkChangeError, match="not in the benchmark"):
        freeze_benchmark(manifest, frames, remove_logs=["nope"], reason="x")
    with pytest.raises(BenchmarkChangeError, match="not in the given frames"):
        freeze_benchmark(manifest, frames, add_logs=["nope"], reason="x")
    trained = "day-clear-highway-log05"
    with pytest.raises(BenchmarkChangeError, match="training already used"):
        freeze_benchmark(manifest, frames, add_logs=[trained], exclude_logs=[trained], reason="x")


def test_exclusion_keeps_benchmark_logs_out_of_training(fleet: pd.DataFrame) -> None:
    manifest = freeze_benchmark(None, fleet, **PARAMS)
    held_out = benchmark_log_ids(manifest)
    assert held_out, "the demo fleet has multi-log slices, so something is held out"

    training = exclude_benchmark(fleet, manifest)
    benchmark = benchmark_frames(fleet, manifest)
    assert not set(training["log_id"]) & held_out
    assert set(benchmark["log_id"]) == held_out
    assert len(training) + len(benchmark) == len(fleet)
    # Every slice the benchmark covers is still trained on.
    assert set(manifest["slices"]) <= set(training["slice"])

    split = split_by_log(training, 0.2, 0)
    assert not set(split["log_id"]) & held_out
