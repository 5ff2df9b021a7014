"""Real fleet frames for tests that need learnable data: highway-env drives, anonymized and
tabled exactly as ``anonymized_frames`` + ``scene_index`` publish them, cached per process."""

from __future__ import annotations

from functools import lru_cache

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
