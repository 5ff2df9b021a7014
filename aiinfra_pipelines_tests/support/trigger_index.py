"""Scene-index rows and fleet telemetry for the trigger proposal tests, written by hand.

Only the columns proposals and the loop summary read (the scene index's identity, slice and
condition columns, speed, trigger config version, upload branch), so every expected figure in
the tests can be worked out from the row counts; published at the keys ingest and operations
publish them at, so the lake-reading code meets them where it meets the real ones.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.io_manager import asset_object_base, parquet_bytes
from aiinfra_pipelines.lake.layout import PUBLISHED_TELEMETRY_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects


def slice_rows(
    slice_name: str,
    logs: int,
    frames_per_log: int,
    *,
    version: str = "triggers-2",
    branch: str = "a",
) -> pd.DataFrame:
    """``logs`` logs of ``frames_per_log`` frames in one slice, kept by config ``version``."""
    lighting, weather, road_type = slice_name.split("/")
    rows = [
        {
            "log_id": f"{slice_name.replace('/', '-')}-{version}-{branch}-{log}",
            "frame_index": frame,
            "slice": slice_name,
            "lighting": lighting,
            "weather": weather,
            "road_type": road_type,
            "speed_mps": 20.0 + frame,
            "trigger_config_version": version,
            "source_branch": f"ingest-{branch}",
            "raw_available": True,
        }
        for log in range(logs)
        for frame in range(frames_per_log)
    ]
    return pd.DataFrame(rows)


def publish_index_and_telemetry(
    lake: VersionedLake, index: pd.DataFrame, telemetry: pd.DataFrame
) -> str:
    """One scene-index partition per upload branch and the published telemetry, on main."""
    objects = {
        asset_object_base(dg.AssetKey("scene_index"), f"{branch}/logs/all.mcap")
        + ".parquet": parquet_bytes(rows.reset_index(drop=True))
        for branch, rows in index.groupby("source_branch")
    }
    objects[f"{PUBLISHED_TELEMETRY_PREFIX}records.parquet"] = parquet_bytes(telemetry)
    return publish_objects(lake, f"test-{uuid.uuid4().hex[:12]}", objects, "index", {})
