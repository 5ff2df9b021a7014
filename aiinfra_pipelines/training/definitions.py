"""The training layer's Dagster definitions."""

import dagster as dg

from .assets import trained_model

defs = dg.Definitions(assets=[trained_model])
