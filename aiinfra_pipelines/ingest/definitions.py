"""The ingestion layer's Dagster definitions."""

import dagster as dg

from .assets import drive_logs, ingest_batch_logs, published_ingest
from .checks import ingest_checks

defs = dg.Definitions(
    assets=[drive_logs, ingest_batch_logs, published_ingest],
    asset_checks=ingest_checks(),
)
