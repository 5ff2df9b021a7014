"""Typed access to ``resources/datasets.yaml`` (split, benchmark and sampling settings).

The numbers live in YAML so a data owner can change a fraction without touching code; this
module only validates and types them. Calibration size and shares are a quality gate and stay
in ``gates.yaml`` (see ``calibration_gates``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml


@dataclass(frozen=True)
class DatasetSettings:
    """The arguments ``split_by_log``, ``freeze_benchmark`` and calibration sampling get."""

    seed: int
    val_fraction: float
    benchmark_fraction: float
    min_benchmark_logs_per_slice: int


def dataset_settings(config: dict[str, Any] | None = None) -> DatasetSettings:
    """Parse ``datasets.yaml`` (or an already loaded mapping, for tests)."""
    config = config if config is not None else load_resource_yaml("datasets.yaml")
    settings = DatasetSettings(
        seed=int(config["seed"]),
        val_fraction=float(config["split"]["val_fraction"]),
        benchmark_fraction=float(config["benchmark"]["fraction"]),
        min_benchmark_logs_per_slice=int(config["benchmark"]["min_logs_per_slice"]),
    )
    if not 0.0 < settings.val_fraction < 1.0:
        raise ValueError(f"datasets.yaml split.val_fraction must be in (0, 1): {settings}")
    if not 0.0 <= settings.benchmark_fraction < 1.0:
        raise ValueError(f"datasets.yaml benchmark.fraction must be in [0, 1): {settings}")
    return settings


def calibration_gates(
    gates: dict[str, Any] | None = None,
) -> tuple[int, dict[str, dict[str, float]]]:
    """``(samples, min_share)`` from gates.yaml ``calibration``."""
    section = (gates if gates is not None else load_resource_yaml("gates.yaml"))["calibration"]
    min_share = {
        str(dim): {str(value): float(share) for value, share in shares.items()}
        for dim, shares in section["min_share"].items()
    }
    return int(section["samples"]), min_share
