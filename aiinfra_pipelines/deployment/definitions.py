"""The deployment layer's Dagster definitions."""

import dagster as dg

from .assets import (
    engine_benchmark,
    engine_benchmark_within_latency_budget,
    engine_parity,
    engine_parity_within_budget,
    onnx_model,
    published_engine,
    quantized_engine,
)
from .compression_assets import compression_report_asset

defs = dg.Definitions(
    assets=[
        onnx_model,
        quantized_engine,
        engine_parity,
        engine_benchmark,
        published_engine,
        compression_report_asset,
    ],
    asset_checks=[engine_parity_within_budget, engine_benchmark_within_latency_budget],
)
