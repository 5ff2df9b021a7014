"""Real fleet frames for tests that need learnable data: highway-env drives, anonymized and
tabled exactly as ``anonymized_frames`` + ``scene_index`` publish them, cached per process."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.ingest.tables import frames_table, slice_name
from aiinfra_pipelines.logs.anonymize import anonymize_log

TEST_KEY = b"k" * 32


@lru_cache(maxsize=4)
def fleet_frames(n_vehicles: int = 4, episodes: int = 2, seed: int = 0) -> pd.DataFrame:
    """One row per frame: the ``anonymized_frames`` columns plus slice tags and ``log_id``."""
    tables = []
    for log in drive_fleet(n_vehicles, episodes, seed):
        meta = log.metadata
        table = frames_table(anonymize_log(log, TEST_KEY))
        tables.append(
            table.assign(
                weather=meta["weather"],
                lighting=meta["lighting"],
                road_type=meta["road_type"],
                slice=slice_name(meta["lighting"], meta["weather"], meta["road_type"]),
                events=",".join(sorted({event.rule for event in log.events})),
            )
        )
    return pd.concat(tables, ignore_index=True)


def hold_out_one_log_per_slice(
    frames: pd.DataFrame, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train/val split with no log in both; one val log per slice that has several logs.

    Stratifying by slice lets the val set report an accuracy for most slices; whole logs go
    to one side because consecutive frames of a log are near-duplicates.
    """
    rng = np.random.default_rng(seed)
    val_logs: list[str] = []
    for _, group in frames.groupby("slice", sort=True):
        logs = sorted(group["log_id"].unique())
        if len(logs) >= 2:
            val_logs.append(logs[int(rng.integers(len(logs)))])
    in_val = frames["log_id"].isin(val_logs)
    return frames[~in_val].reset_index(drop=True), frames[in_val].reset_index(drop=True)
