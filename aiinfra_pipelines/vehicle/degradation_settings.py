"""``resources/vehicle.yaml`` → ``degradation``: the thresholds of the car's degradation machine.

Every number the state machine (:mod:`aiinfra_pipelines.vehicle.degradation`) uses is here:
what makes a frame faulty (confidence floor, latency budget, sensor age), how many consecutive
faulty frames enter ``degraded`` (per cause: one engine error is enough, one dim frame is not),
how many clean frames recover, and how long ``degraded`` may last before the car gives up and
performs its minimal-risk manoeuvre. Checks refuse settings that would make the machine
ill-defined (a recovery from minimal risk no longer than one from degraded, say), naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

CONFIG_FILE = "vehicle.yaml"
SECTION = "degradation"

# The faults a frame can have, in the order the machine reports them when several reach their
# threshold on the same frame (the most severe first: no output at all, then old input).
ENGINE_ERROR = "engine_error"
STALE_SENSOR = "stale_sensor"
LATENCY_OVER_BUDGET = "latency_over_budget"
LOW_CONFIDENCE = "low_confidence"
FAULT_CAUSES: tuple[str, ...] = (ENGINE_ERROR, STALE_SENSOR, LATENCY_OVER_BUDGET, LOW_CONFIDENCE)


@dataclass(frozen=True)
class DegradationSettings:
    """The ``degradation`` block of vehicle.yaml (see the file for what each number means)."""

    min_confidence: float
    latency_budget_ms: float
    max_sensor_age_ms: float
    enter_after_frames: Mapping[str, int]
    recover_after_frames: int
    degraded_timeout_s: float
    minimal_risk_recover_after_frames: int
    version: str = ""

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DegradationSettings:
        """From ``vehicle.yaml`` (or the given mapping); errors name the file and key."""
        config = settings_section(CONFIG_FILE, "", config).values
        section = config.get(SECTION)
        if not isinstance(section, Mapping):
            raise KeyError(f"{CONFIG_FILE} has no {SECTION} section")
        enter = section.get("enter_after_frames")
        if not isinstance(enter, Mapping):
            raise KeyError(f"{CONFIG_FILE} {SECTION}.enter_after_frames must map cause -> frames")
        unknown = sorted(set(enter) - set(FAULT_CAUSES))
        missing = sorted(set(FAULT_CAUSES) - set(enter))
        if unknown or missing:
            raise ValueError(
                f"{CONFIG_FILE} {SECTION}.enter_after_frames must name exactly the causes "
                f"{list(FAULT_CAUSES)} (unknown: {unknown}, missing: {missing})"
            )
        settings = cls(
            min_confidence=float(section["min_confidence"]),
            latency_budget_ms=float(section["latency_budget_ms"]),
            max_sensor_age_ms=float(section["max_sensor_age_ms"]),
            enter_after_frames={cause: int(enter[cause]) for cause in FAULT_CAUSES},
            recover_after_frames=int(section["recover_after_frames"]),
            degraded_timeout_s=float(section["degraded_timeout_s"]),
            minimal_risk_recover_after_frames=int(section["minimal_risk_recover_after_frames"]),
            version=str(config.get("version", "")),
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ``ValueError`` naming the key when the numbers cannot define the machine."""
        where = f"{CONFIG_FILE} {SECTION}"
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"{where}.min_confidence must be within 0..1")
        for key in ("latency_budget_ms", "max_sensor_age_ms", "degraded_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{where}.{key} must be positive")
        for cause, frames in self.enter_after_frames.items():
            if frames < 1:
                raise ValueError(f"{where}.enter_after_frames.{cause} must be >= 1")
        if self.recover_after_frames < 1:
            raise ValueError(f"{where}.recover_after_frames must be >= 1")
        if self.minimal_risk_recover_after_frames <= self.recover_after_frames:
            raise ValueError(
                f"{where}.minimal_risk_recover_after_frames must be longer than "
                "recover_after_frames: leaving minimal risk needs the longer clean period"
            )
