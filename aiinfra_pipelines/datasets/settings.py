"""Typed access to ``resources/datasets.yaml`` (split, benchmark, sampling) and calibration gates.

The numbers live in YAML so a data owner can change a fraction without touching code; this
module only validates and types them. Calibration size and shares are a quality gate and stay
in ``gates.yaml`` (see ``CalibrationGates``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.config import SettingsError, settings_section
from aiinfra_pipelines.curation.label_errors import CrossFitSettings
from aiinfra_pipelines.curation.selection import SelectionParams

CONFIG_FILE = "datasets.yaml"
GATES_FILE = "gates.yaml"


@dataclass(frozen=True)
class DatasetSettings:
    """The arguments ``split_by_log``, ``freeze_benchmark`` and calibration sampling get."""

    seed: int
    val_fraction: float
    benchmark_fraction: float
    min_benchmark_logs_per_slice: int
    # A vehicle's logs are one drive while each starts within this many seconds of the end of
    # the one before (datasets.drives): the unit splits and the benchmark hold out.
    drive_max_gap_s: float

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DatasetSettings:
        """From ``datasets.yaml`` (or an already loaded mapping, for tests)."""
        datasets = settings_section(CONFIG_FILE, "", config)
        split, benchmark = datasets.section("split"), datasets.section("benchmark")
        val_fraction, benchmark_fraction = (
            split.float("val_fraction"),
            benchmark.float("fraction"),
        )
        if not 0.0 < val_fraction < 1.0:
            raise split.error("val_fraction", f"must be in (0, 1), got {val_fraction}")
        if not 0.0 <= benchmark_fraction < 1.0:
            raise benchmark.error("fraction", f"must be in [0, 1), got {benchmark_fraction}")
        return cls(
            seed=datasets.int("seed"),
            val_fraction=val_fraction,
            benchmark_fraction=benchmark_fraction,
            min_benchmark_logs_per_slice=benchmark.int("min_logs_per_slice"),
            drive_max_gap_s=datasets.section("drives").float("max_gap_s"),
        )


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
class SelectionSettings:
    """``datasets.yaml`` ``selection``: the budget accepted badcases are chosen under, and how.

    The numbers become a ``curation.selection.SelectionParams`` (which validates them); a bad
    value is reported against this file and key.
    """

    params: SelectionParams

    @property
    def budget_frames(self) -> int:
        return self.params.budget_frames

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> SelectionSettings:
        section = settings_section(CONFIG_FILE, "selection", config)
        try:
            params = SelectionParams(
                budget_frames=section.int("budget_frames"),
                confidence_weight=section.float("confidence_weight"),
                disagreement_weight=section.float("disagreement_weight"),
                diversity_weight=section.float("diversity_weight"),
                min_slice_share=section.float("min_slice_share"),
                weak_slice_share=section.float("weak_slice_share"),
                weakness_baseline=section.float("weakness_baseline"),
                coverage_share=section.float("coverage_share"),
                clip_radius=section.int("clip_radius"),
                ensemble_members=section.int("ensemble_members"),
                ridge=section.float("ridge"),
            )
        except ValueError as error:
            if isinstance(error, SettingsError):
                raise
            raise SettingsError(f"resources/{CONFIG_FILE}: selection: {error}") from None
        return cls(params)


@dataclass(frozen=True)
class DataHealthSettings:
    """``datasets.yaml`` ``data_health``: thresholds of the training dataset's health checks."""

    max_rows: int  # rows of each check's table shown in the UI
    cross_fit: CrossFitSettings  # out-of-fold model for label errors (seed: ``seed``)
    fallback_thumbnail: tuple[int, int]  # rows, columns of the grey thumbnail feature
    min_embedding_coverage: float  # share of frames one engine must have embedded
    min_cell_auc: float
    min_margin: float
    max_label_error_rate: float
    duplicate_distance: int
    duplicate_same_log: bool
    max_duplicate_rate: float
    leak_distance: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DataHealthSettings:
        section = settings_section(CONFIG_FILE, "data_health", config)
        labels = section.section("label_errors")
        duplicates, leaks = section.section("near_duplicates"), section.section("split_leaks")
        thumbnail = labels.list("fallback_thumbnail")
        if len(thumbnail) != 2 or any(not isinstance(v, int) or v < 1 for v in thumbnail):
            raise labels.error("fallback_thumbnail", f"expected [rows, columns] > 0: {thumbnail}")
        try:
            cross_fit = CrossFitSettings(
                folds=labels.int("folds"),
                components=labels.int("components"),
                l2=labels.float("l2"),
                iterations=labels.int("iterations"),
                seed=settings_section(CONFIG_FILE, "", config).int("seed"),
            )
        except ValueError as error:
            if isinstance(error, SettingsError):
                raise
            raise labels.error("folds", str(error)) from None
        settings = cls(
            max_rows=section.int("max_rows"),
            cross_fit=cross_fit,
            fallback_thumbnail=(int(thumbnail[0]), int(thumbnail[1])),
            min_embedding_coverage=labels.float("min_embedding_coverage"),
            min_cell_auc=labels.float("min_cell_auc"),
            min_margin=labels.float("min_margin"),
            max_label_error_rate=labels.float("max_rate"),
            duplicate_distance=duplicates.int("max_distance"),
            duplicate_same_log=duplicates.bool("same_log"),
            max_duplicate_rate=duplicates.float("max_rate"),
            leak_distance=leaks.int("max_distance"),
        )
        for owner, key, value in (
            (duplicates, "max_distance", settings.duplicate_distance),
            (leaks, "max_distance", settings.leak_distance),
        ):
            if not 0 <= value < 64:
                raise owner.error(key, f"a 64-bit Hamming distance must be in [0, 64): {value}")
        if settings.max_rows < 1:
            raise section.error("max_rows", f"must be >= 1: {settings.max_rows}")
        return settings


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
