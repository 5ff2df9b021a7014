"""The training layer's Dagster definitions."""

import dagster as dg

from .assets import teacher_model, trained_model

defs = dg.Definitions(assets=[teacher_model, trained_model])
