"""Staged-rollout settings: ``gates.yaml`` → ``release.rollout``, validated once on load.

Kept apart from the state machine so the stage list and budgets can be read (sensors, reports)
without pulling in telemetry or lake code, and so a bad gates file fails at load, not in the
middle of a stage decision.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

# Budgeted metrics and the direction that is worse for the candidate.
INCREASE_IS_WORSE = (
    "collision_rate_per_1k_frames",
    "near_miss_rate_per_1k_frames",
    "fallback_rate",
    "latency_p95_ms",
)
BUDGET_METRICS = (*INCREASE_IS_WORSE, "confidence_mean_drop")


@dataclass(frozen=True)
class Stage:
    name: str
    percent: float
    min_candidate_frames: int
    min_candidate_vehicles: int


@dataclass(frozen=True)
class RolloutSettings:
    """``gates.yaml`` → ``release.rollout`` (validated: increasing stages ending at 100 %)."""

    stages: tuple[Stage, ...]
    min_control_frames: int
    approval_required_from_percent: float
    budgets: dict[str, float]
    version: str = ""

    def needs_approval(self, stage_index: int) -> bool:
        """Entering this stage needs a person; the 100 % stage always does."""
        percent = self.stages[stage_index].percent
        return percent >= 100.0 or percent >= self.approval_required_from_percent

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> RolloutSettings:
        """From ``gates.yaml`` (or ``config``, the whole gates mapping); errors name the key."""
        gates = settings_section("gates.yaml", "", config)
        nested = bool((gates.raw("release", None) or {}).get("rollout"))
        if not nested and not gates.raw("rollout", None):
            raise KeyError("gates.yaml has no release.rollout section (staged rollout settings)")
        path = "release.rollout" if nested else "rollout"  # top level: older gates files
        section = settings_section("gates.yaml", path, gates.values)
        stages = tuple(
            Stage(
                name=stage.str("name"),
                percent=stage.float("percent"),
                min_candidate_frames=stage.int("min_candidate_frames", 0),
                min_candidate_vehicles=stage.int("min_candidate_vehicles", 0),
            )
            for stage in section.sections("stages")
        )
        percents = [stage.percent for stage in stages]
        if not stages or percents[-1] != 100.0:
            raise ValueError(f"rollout stages must end at 100 %, got {percents}")
        if any(b <= a for a, b in itertools.pairwise(percents)) or percents[0] <= 0:
            raise ValueError(f"rollout stage percents must increase within (0, 100]: {percents}")
        budget_section = section.section("budgets")
        budgets = {str(key): budget_section.float(key) for key in budget_section.values}
        unknown = sorted(set(budgets) - set(BUDGET_METRICS))
        if unknown:
            raise ValueError(f"unknown rollout budget(s) {unknown}; known: {list(BUDGET_METRICS)}")
        return cls(
            stages=stages,
            min_control_frames=section.int("min_control_frames"),
            approval_required_from_percent=section.float("approval_required_from_percent"),
            budgets=budgets,
            version=gates.str("version", ""),
        )
