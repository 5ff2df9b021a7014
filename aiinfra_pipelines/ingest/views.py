"""Combined views across drive-log partitions, read straight from a lake ref.

Each partition of ``scene_index`` is its own Parquet object (written and published by its own
run, so runs never conflict); these functions are the "whole fleet" table on top.
"""

from __future__ import annotations

import pandas as pd

from aiinfra_pipelines.lake.io_manager import read_asset_partitions, read_parquet_prefix
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .quarantine import QUARANTINE_PREFIX


def raw_available(index: pd.DataFrame) -> pd.Series:
    """Per row, whether its frames are in the lake (rows indexed before index records were:
    a missing column or value means True)."""
    if "raw_available" not in index:
        return pd.Series(True, index=index.index, dtype=bool)
    return index["raw_available"].fillna(True).astype(bool)


def scene_index_view(
    lake: VersionedLake, ref: str = MAIN_BRANCH, *, include_index_only: bool = False
) -> pd.DataFrame:
    """Every published scene-index row at ``ref`` whose frames are in the lake.

    Rows indexed from a car's index record (``raw_available`` False: the raw log is still on
    the car) have no frames to train, mine or evaluate on, so only a caller that asks for them
    (status, pull requests, the loop summary) gets them; and once a pull brought the raw log,
    its index-only rows give way to the raw ones.
    """
    index = read_asset_partitions(lake, "scene_index", ref)
    if index.empty or "raw_available" not in index:
        return index
    raw = raw_available(index)
    if not include_index_only:
        return index[raw].reset_index(drop=True)
    superseded = ~raw & index["log_id"].isin(set(index.loc[raw, "log_id"]))
    return index[~superseded].reset_index(drop=True)


def quarantine_view(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """Every quarantine record at ``ref``."""
    return read_parquet_prefix(lake, ref, QUARANTINE_PREFIX)
