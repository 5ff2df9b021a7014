"""Combined views across drive-log partitions, read straight from a lake ref.

Each partition of ``scene_index`` is its own Parquet object (written and published by its own
run, so runs never conflict); these functions are the "whole fleet" table on top.
"""

from __future__ import annotations

import pandas as pd

from aiinfra_pipelines.lake.io_manager import read_asset_partitions, read_parquet_prefix
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH

from .quarantine import QUARANTINE_PREFIX


def scene_index_view(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """Every published scene-index row (all logs) at ``ref``."""
    return read_asset_partitions(lake, "scene_index", ref)


def quarantine_view(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """Every quarantine record at ``ref``."""
    return read_parquet_prefix(lake, ref, QUARANTINE_PREFIX)
