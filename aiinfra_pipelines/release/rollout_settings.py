"""Staged-rollout settings: ``gates.yaml`` → ``release.rollout``, validated once on load.

Kept apart from the state machine so the stage list and budgets can be read (sensors, reports)
without pulling in telemetry or lake code, and so a bad gates file fails at load, not in the
middle of a stage decision.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiinfra_pipelines.config import Section, settings_section
from aiinfra_pipelines.statistics.sequential_rates import RateBatch, RateTest, judge_rates

# Budgeted per-vehicle metrics (means over telemetry records) and the direction that is worse.
INCREASE_IS_WORSE = ("fallback_rate", "latency_p95_ms")
BUDGET_METRICS = (*INCREASE_IS_WORSE, "confidence_mean_drop")
# Safety events are rates over exposure, judged by their own sequential tests (``events``).
EVENT_COLUMNS = ("at_fault_collisions", "collisions", "near_misses")


@dataclass(frozen=True)
class EventTest:
    """One safety event's sequential test (gates.yaml ``release.rollout.events.<name>``)."""

    column: str  # the telemetry count it reads
    test: RateTest
    # The control cohort's rate the stage sizes assume (per 1,000 frames); the tests themselves
    # compare with the concurrent control cohort, never with this number.
    control_rate_per_1k_frames: float

    @classmethod
    def load(cls, section: Section) -> EventTest:
        column = section.str("column")
        if column not in EVENT_COLUMNS:
            raise section.error("column", f"must be one of {list(EVENT_COLUMNS)}, got {column!r}")
        try:
            test = RateTest(
                margin=section.float("margin"),
                harm_alpha=section.float("harm_alpha"),
                noninferiority_alpha=section.float("noninferiority_alpha"),
                harm_alternatives=tuple(float(r) for r in section.list("harm_alternatives")),
                noninferiority_alternatives=tuple(
                    float(r) for r in section.list("noninferiority_alternatives")
                ),
            )
        except ValueError as exc:
            raise section.error("margin", str(exc)) from exc
        return cls(column, test, section.float("control_rate_per_1k_frames"))

    def expected_frames_to_decide(self, candidate_percent: float, ratio: float = 1.0) -> float:
        """Candidate frames after which the test decides when the counts come in exactly at
        their expectation: the control at ``control_rate_per_1k_frames``, the candidate at
        ``ratio`` times it, the fleet split ``candidate_percent`` : the rest."""
        rate = self.control_rate_per_1k_frames / 1000.0
        control_per_candidate = (100.0 - min(candidate_percent, 99.0)) / max(
            candidate_percent, 1e-9
        )
        frames = 1.0 / rate
        for _ in range(60):
            batch = RateBatch(
                rate * ratio * frames,
                frames,
                rate * frames * control_per_candidate,
                frames * control_per_candidate,
            )
            if judge_rates(self.test, [batch], rate).outcome != "undecided":
                return frames
            frames *= 1.25
        return float("inf")


@dataclass(frozen=True)
class Stage:
    name: str
    percent: float
    min_candidate_frames: int
    min_candidate_vehicles: int
    # Candidate frames after which an undecided stage is reported as past its size (the
    # operator decides: the tests keep running); derived from the event tests' margins and
    # levels (RolloutSettings.load), not set by hand.
    exposure_cap_frames: int = 0


@dataclass(frozen=True)
class RolloutSettings:
    """``gates.yaml`` → ``release.rollout`` (validated: increasing stages ending at 100 %)."""

    stages: tuple[Stage, ...]
    min_control_frames: int
    approval_required_from_percent: float
    budgets: dict[str, float]
    version: str = ""
    events: dict[str, EventTest] = field(default_factory=dict)
    budget_alpha: float = 0.01  # level of each budget test, spent over a stage's looks
    frame_rate_hz: float = 10.0  # the cars' frames per second (exposure as drive time)
    exposure_cap_factor: float = 3.0

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
        events = {
            str(name): EventTest.load(section.section("events").section(str(name)))
            for name in section.section("events").values
        }
        if not events:
            raise section.error("events", "needs at least one safety event test")
        cap_factor = section.float("exposure_cap_factor")
        stages = tuple(
            replace(
                stage,
                exposure_cap_frames=math.ceil(
                    cap_factor
                    * max(
                        event.expected_frames_to_decide(stage.percent) for event in events.values()
                    )
                )
                if stage.percent < 100.0
                else 0,
            )
            for stage in stages
        )
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
            events=events,
            budget_alpha=section.float("budget_alpha"),
            frame_rate_hz=section.float("frame_rate_hz"),
            exposure_cap_factor=cap_factor,
        )
