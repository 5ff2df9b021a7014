"""The evaluation layer's Dagster definitions."""

import dagster as dg

from .assets import offline_eval, offline_eval_no_slice_regression, published_model

defs = dg.Definitions(
    assets=[offline_eval, published_model], asset_checks=[offline_eval_no_slice_regression]
)
