"""The ingestion layer's Dagster definitions."""

import dagster as dg

from .assets import (
    anonymized_frames,
    drive_logs,
    published_ingest,
    scene_index,
    validated_drive_logs,
)
from .checks import ingest_checks

defs = dg.Definitions(
    assets=[drive_logs, validated_drive_logs, anonymized_frames, scene_index, published_ingest],
    asset_checks=ingest_checks(),
)
