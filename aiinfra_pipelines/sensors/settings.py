"""Sensor settings: how often each sensor ticks and what makes the loop retrain.

Intervals live with the layer they pace (``operations.yaml`` ``sensors``, ``simulation.yaml``
``sensor``, ``loop.yaml`` ``retraining``); they are read here, once, into typed values, so a
typo in an operator's file fails when the definitions load instead of at the first tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section


@dataclass(frozen=True)
class SensorSettings:
    """``operations.yaml`` ``sensors``: the release and operations sensors' pace and memory."""

    telemetry_interval_s: int
    rollout_interval_s: int
    failure_interval_s: int
    # Run keys a sensor remembers in its cursor; older ones are forgotten.
    remembered_run_keys: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> SensorSettings:
        section = settings_section("operations.yaml", "sensors", config)
        return cls(
            telemetry_interval_s=section.int("telemetry_interval_s"),
            rollout_interval_s=section.int("rollout_interval_s"),
            failure_interval_s=section.int("failure_interval_s"),
            remembered_run_keys=section.int("remembered_run_keys"),
        )


@dataclass(frozen=True)
class RetrainingSettings:
    """``loop.yaml`` ``retraining``: when the loop starts a training cycle on its own."""

    min_unseen_badcases: int
    on_drift: bool
    interval_s: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> RetrainingSettings:
        section = settings_section("loop.yaml", "retraining", config)
        return cls(
            min_unseen_badcases=section.int("min_unseen_badcases"),
            on_drift=section.bool("on_drift", False),
            interval_s=section.int("interval_s"),
        )


@dataclass(frozen=True)
class SimulationSensorSettings:
    """``simulation.yaml`` ``sensor``: the regression simulation sensor's pace."""

    interval_s: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> SimulationSensorSettings:
        return cls(
            interval_s=settings_section("simulation.yaml", "sensor", config).int("interval_s")
        )
