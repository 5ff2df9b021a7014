"""``resources/mining.yaml``: the engine, the badcase rules, label QC and raw-segment pulls.

Every mining function takes ``config`` (the whole file as a mapping, or ``None`` for the
operator's file) so tests pass an edited copy; ``MiningSettings.load`` turns it into typed,
validated values once, and nothing in the mining code carries a threshold of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import Section, settings_section

MINING_CONFIG_FILE = "mining.yaml"


@dataclass(frozen=True)
class EngineSettings:
    """``engine``: how mining runs the deployed ONNX model."""

    batch_size: int
    chunk_batches: int  # engine batches decoded per chunk (bounds peak memory)
    intra_op_threads: int = 0  # 0: onnxruntime's default

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> EngineSettings:
        section = settings_section(MINING_CONFIG_FILE, "engine", config)
        return cls(
            batch_size=section.int("batch_size"),
            chunk_batches=section.int("chunk_batches"),
            intra_op_threads=section.int("intra_op_threads", 0),
        )


@dataclass(frozen=True)
class RuleSettings:
    """``rules``: which frames count as badcases (every rule has an ``enabled`` switch)."""

    occupied_threshold: float
    low_confidence_threshold: float
    min_flipped_cells: int
    max_frame_gap_s: float
    max_cell_disagreement: float
    max_lead_gap_error_m: float
    event_rules: tuple[str, ...]
    enabled: Mapping[str, bool]  # rule name (``rules.REASONS``) → switched on

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> RuleSettings:
        from .rules import REASONS  # the rule names live with the rules

        section = settings_section(MINING_CONFIG_FILE, "rules", config)
        rules = {name: section.section(name) for name in REASONS}
        instability = rules["temporal_instability"]
        disagreement = rules["label_disagreement"]
        return cls(
            occupied_threshold=section.float("occupied_threshold"),
            low_confidence_threshold=rules["low_confidence"].float("threshold"),
            min_flipped_cells=instability.int("min_flipped_cells"),
            max_frame_gap_s=instability.float("max_frame_gap_s"),
            max_cell_disagreement=disagreement.float("max_cell_disagreement"),
            max_lead_gap_error_m=disagreement.float("max_lead_gap_error_m"),
            event_rules=tuple(str(rule) for rule in rules["logged_event"].list("rules", [])),
            enabled={name: rule.bool("enabled", True) for name, rule in rules.items()},
        )


@dataclass(frozen=True)
class FlowAlignment:
    """``label_qc.flow_alignment``: rotate positions onto the road axis traffic flows along."""

    enabled: bool = False
    min_speed_mps: float = 0.0
    max_angle_rad: float = 0.0

    @classmethod
    def read(cls, label_qc: Section) -> FlowAlignment:
        """Off when the section is absent or disabled; its bounds are required when on."""
        if label_qc.raw("flow_alignment", None) is None:
            return cls()
        section = label_qc.section("flow_alignment")
        if not section.bool("enabled", False):
            return cls()
        return cls(
            enabled=True,
            min_speed_mps=section.float("min_speed_mps"),
            max_angle_rad=section.float("max_angle_rad"),
        )


@dataclass(frozen=True)
class LabelQcSettings:
    """``label_qc``: the independent labeller, the simulated reviewer, and the verdict."""

    judged_road_types: tuple[str, ...]
    lane_width_m: float
    human_check_fraction: float
    human_flip_probability: float
    seed: int
    agreement_threshold: float
    lead_gap_tolerance_m: float
    flow_alignment: FlowAlignment

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> LabelQcSettings:
        section = settings_section(MINING_CONFIG_FILE, "label_qc", config)
        return cls(
            judged_road_types=tuple(str(name) for name in section.list("judged_road_types")),
            lane_width_m=section.float("lane_width_m"),
            human_check_fraction=section.float("human_check_fraction"),
            human_flip_probability=section.float("human_flip_probability"),
            seed=section.int("seed", 0),
            agreement_threshold=section.float("agreement_threshold"),
            lead_gap_tolerance_m=section.float("lead_gap_tolerance_m"),
            flow_alignment=FlowAlignment.read(section),
        )


@dataclass(frozen=True)
class PullSettings:
    """``pulls``: how many weak slices, and raw segments of them, one request asks for."""

    weak_slices: int
    max_segments: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> PullSettings:
        section = settings_section(MINING_CONFIG_FILE, "pulls", config)
        return cls(weak_slices=section.int("weak_slices"), max_segments=section.int("max_segments"))


def mining_config_version(config: Mapping[str, Any] | None = None) -> str:
    """``version``: recorded with every mined label, so a rule change is visible downstream."""
    return settings_section(MINING_CONFIG_FILE, "", config).str("version")
