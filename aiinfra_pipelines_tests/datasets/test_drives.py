"""Drives as the hold-out unit: the consecutive logs a car cut one drive into stay on one side
of every split and of the benchmark, whatever order they land in."""

from __future__ import annotations

import pandas as pd
import pytest

from aiinfra_pipelines.datasets.benchmark import (
    benchmark_log_ids,
    exclude_benchmark,
    freeze_benchmark,
    select_benchmark_logs,
)
from aiinfra_pipelines.datasets.drives import log_drives, with_drives
from aiinfra_pipelines.datasets.split import SplitLeakageError, assert_disjoint_logs, split_by_log

S = 1_000_000_000  # ns per second
HOUR = 3600 * S


def segment(log_id: str, vehicle: str, start_s: float, slice_: str, frames: int = 3) -> list:
    """One log: ``frames`` frames a second apart from ``start_s``."""
    return [
        {
            "log_id": log_id,
            "frame_index": i,
            "vehicle_pseudonym": vehicle,
            "timestamp_ns": int((start_s + i) * S),
            "slice": slice_,
        }
        for i in range(frames)
    ]


def fleet(drives_per_vehicle: int = 4, segments: int = 3, vehicles: int = 3) -> pd.DataFrame:
    """Each vehicle drives ``drives_per_vehicle`` times an hour apart, each drive cut into
    ``segments`` logs seconds apart; drive d of every vehicle is on slice d % 2."""
    rows = []
    for v in range(vehicles):
        for d in range(drives_per_vehicle):
            slice_ = ("day/clear/highway", "night/fog/merge")[d % 2]
            for s in range(segments):
                start = d * 3600 + s * 20
                rows += segment(f"v{v}-d{d}-s{s}", f"car-{v}", start, slice_)
    return pd.DataFrame(rows)


def test_a_vehicles_logs_close_in_time_are_one_drive():
    frames = fleet(drives_per_vehicle=2, segments=3, vehicles=2)
    drives = log_drives(frames, max_gap_s=600)
    assert len(set(drives.values())) == 4  # 2 vehicles x 2 drives
    assert drives["v0-d0-s0"] == drives["v0-d0-s1"] == drives["v0-d0-s2"]
    assert drives["v0-d0-s0"] != drives["v0-d1-s0"]  # an hour later: another drive
    assert drives["v0-d0-s0"] != drives["v1-d0-s0"]  # same time, another car
    # Stable: a drive's id does not change when later logs join the lake.
    early = log_drives(frames[frames["log_id"].str.endswith("s0")], max_gap_s=600)
    assert early["v0-d0-s0"] == drives["v0-d0-s0"]
    # Without a vehicle nothing says which logs belong together: a drive per log.
    anonymous = frames.assign(vehicle_pseudonym="")
    assert len(set(log_drives(anonymous, max_gap_s=600).values())) == frames["log_id"].nunique()
    untimed = log_drives(frames.drop(columns=["timestamp_ns"]), 600)
    assert len(set(untimed.values())) == frames["log_id"].nunique()
    # The id rests on the drive's first log, not on the pseudonym (which the key decides).
    renamed = log_drives(frames.assign(vehicle_pseudonym=frames["vehicle_pseudonym"] + "x"), 600)
    assert renamed == drives


def test_a_split_keeps_every_log_of_a_drive_on_one_side():
    frames = with_drives(fleet(), max_gap_s=600)
    split = split_by_log(frames, val_fraction=0.3, seed=0)
    per_drive = split.groupby("drive_id")["split"].nunique()
    assert (per_drive == 1).all()
    assert set(split["split"]) == {"train", "val"}
    # By log the same fleet leaks: a drive's segments land on both sides.
    by_log = split_by_log(frames.drop(columns=["drive_id"]), val_fraction=0.3, seed=0)
    leaks = by_log.assign(drive_id=frames["drive_id"]).groupby("drive_id")["split"].nunique()
    assert (leaks > 1).any()
    mixed = split.copy()
    first = mixed["drive_id"] == mixed["drive_id"].iloc[0]
    mixed.loc[first & (mixed["log_id"].str.endswith("s0")), "split"] = "val"
    mixed.loc[first & ~(mixed["log_id"].str.endswith("s0")), "split"] = "train"
    with pytest.raises(SplitLeakageError, match=r"drive\(s\) appear in several splits"):
        assert_disjoint_logs(mixed, group_column="drive_id")


def test_the_benchmark_holds_out_whole_drives_and_training_never_sees_the_rest_of_one():
    frames = with_drives(fleet(drives_per_vehicle=6), max_gap_s=600)
    chosen = select_benchmark_logs(frames, fraction=0.2, seed=0, min_logs_per_slice=1)
    held = {log for logs in chosen.values() for log in logs}
    drives = frames.drop_duplicates("log_id").set_index("log_id")["drive_id"]
    for drive in {drives[log] for log in held}:
        assert set(drives[drives == drive].index) <= held  # every segment of the drive
    manifest = freeze_benchmark(None, frames, fraction=0.2, seed=0, min_logs_per_slice=1)
    assert benchmark_log_ids(manifest) == held
    # A later segment of a held-out drive (a pulled log, or a benchmark from before drives)
    # never reaches training.
    late_log = next(iter(sorted(held)))
    vehicle = frames.loc[frames["log_id"] == late_log, "vehicle_pseudonym"].iloc[0]
    start = frames.loc[frames["log_id"] == late_log, "timestamp_ns"].max() / S + 30
    late = pd.DataFrame(segment("late-segment", vehicle, start, "day/clear/highway"))
    grown = with_drives(pd.concat([frames, late], ignore_index=True), max_gap_s=600)
    training = exclude_benchmark(grown, manifest)
    assert "late-segment" not in set(training["log_id"])
    assert not set(training["log_id"]) & held
    # A drive with a log some model trained on is never held out.
    trained = {log for log in frames["log_id"] if log.startswith("v0-")}
    again = select_benchmark_logs(
        frames, fraction=0.2, seed=0, min_logs_per_slice=1, exclude_logs=trained
    )
    assert not {log for logs in again.values() for log in logs} & {
        log for log in frames["log_id"] if log.startswith("v0-")
    }
