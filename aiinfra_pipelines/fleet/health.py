"""What the car's degradation monitor is told about latency and sensor age in simulation.

On a car both are measured: inference wall-clock time against the budget, and the camera
frame's age when perceived. In simulation neither measurement means what it means on the car:
the simulator's host is not the car's computer (its wall-clock varies with machine load, which
would make the same episode drive differently run to run), and highway-env renders each frame
synchronously, so a frame is never old. :class:`SimulatedHealth` is therefore explicit about
both: by default latency is not judged and every frame is fresh, so an episode stays a
deterministic function of its setup; a test or a drill injects latency overruns and stale
frames at given policy steps, or opts into judging the measured latency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimulatedHealth:
    """Per-step latency (ms) and sensor age (ms) to report to the degradation monitor.

    ``latency_ms[step]`` replaces the measured perception latency at that step;
    ``sensor_age_ms[step]`` makes that step's camera frame that old. Elsewhere the latency is
    the measured one when ``measure_latency`` (nondeterministic) and unjudged otherwise, and
    the frame is fresh.
    """

    latency_ms: Mapping[int, float] = field(default_factory=dict)
    sensor_age_ms: Mapping[int, float] = field(default_factory=dict)
    measure_latency: bool = False

    def perception_latency_ms(self, step: int, measured_ms: float) -> float | None:
        """The latency the monitor judges at ``step`` (``None``: not judged)."""
        if step in self.latency_ms:
            return float(self.latency_ms[step])
        return float(measured_ms) if self.measure_latency else None

    def sensor_age_ns(self, step: int) -> int:
        """How old the camera frame of ``step`` is when perceived, in nanoseconds."""
        return round(float(self.sensor_age_ms.get(step, 0.0)) * 1_000_000)
