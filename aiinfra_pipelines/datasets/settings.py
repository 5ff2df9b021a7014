"""Typed access to ``resources/datasets.yaml`` (split, benchmark, sampling) and calibration gates.

The numbers live in YAML so a data owner can change a fraction without touching code; this
module only validates and types them. Calibration size and shares are a quality gate and stay
in ``gates.yaml`` (see ``CalibrationGates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.config import settings_section

CONFIG_FILE = "datasets.yaml"
GATES_FILE = "gates.yaml"


@dataclass(frozen=True)
class DatasetSettings:
    """The arguments ``split_by_log``, ``freeze_benchmark`` and calibration sampling get."""

    seed: int
    val_fraction: float
    benchmark_fraction: float
    min_benchmark_logs_per_slice: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DatasetSettings:
        """From ``datasets.yaml`` (or an already loaded mapping, for tests)."""
        datasets = settings_section(CONFIG_FILE, "", config)
        split, benchmark = datasets.section("split"), datasets.section("benchmark")
        settings = cls(
            seed=datasets.int("seed"),
            val_fraction=split.float("val_fraction"),
            benchmark_fraction=benchmark.float("fraction"),
            min_benchmark_logs_per_slice=benchmark.int("min_logs_per_slice"),
        )
        if not 0.0 < settings.val_fraction < 1.0:
            raise split.error("val_fraction", f"must be in (0, 1): {settings}")
        if not 0.0 <= settings.benchmark_fraction < 1.0:
            raise benchmark.error("fraction", f"must be in [0, 1): {settings}")
        return settings


@dataclass(frozen=True)
class TrainingSelection:
    """``datasets.yaml`` ``training``: which frames a dataset version trains on."""

    base_fraction: float  # share of ordinary (non-badcase) frames kept
    # Conditions left out entirely, e.g. {"lighting": ["night"]} (free-form: column → values).
    exclude: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> TrainingSelection:
        section = settings_section(CONFIG_FILE, "training", config)
        return cls(
            base_fraction=section.float("base_fraction"),
            exclude=dict(section.raw("exclude", None) or {}),
        )


@dataclass(frozen=True)
class CalibrationGates:
    """``gates.yaml`` ``calibration``: quantization sample size and minimum condition shares."""

    samples: int
    min_share: dict[str, dict[str, float]]  # dimension → value → minimum share

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> CalibrationGates:
        section = settings_section(GATES_FILE, "calibration", config)
        shares = section.section("min_share")
        return cls(
            samples=section.int("samples"),
            min_share={
                str(dim): {
                    str(value): shares.section(dim).float(value)
                    for value in shares.section(dim).values
                }
                for dim in shares.values
            },
        )
