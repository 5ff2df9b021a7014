"""The datasets layer's Dagster definitions."""

import dagster as dg

from .assets import benchmark_set, calibration_set, training_dataset
from .checks import training_dataset_health

defs = dg.Definitions(
    assets=[benchmark_set, training_dataset, calibration_set],
    asset_checks=[training_dataset_health],
)
