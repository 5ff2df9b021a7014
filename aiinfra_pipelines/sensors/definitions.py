"""The sensors' Dagster definitions."""

import dagster as dg

from .ingest_sensor import lakefs_ingest_sensor

defs = dg.Definitions(sensors=[lakefs_ingest_sensor])
