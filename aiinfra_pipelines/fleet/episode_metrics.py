"""What one closed-loop episode measured, on privileged ground truth, never on what the
engine believed: collision (and the frame before it, for fault), minimum time-to-collision to
the lead, progress, hard brakes, jerk, fallback activations, shadow agreement, degradation
transitions and per-step wall-clock timings of simulator, perception and planner.

:class:`EpisodeTrace` accumulates them step by step inside :func:`.closed_loop.run_episode`;
:class:`EpisodeMetrics` is what it returns. Kept apart from the loop so that the loop reads as
sense → perceive → plan → act and the definitions of the measures sit in one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from aiinfra_pipelines.fleet.planner import ACTION_NAMES
from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.logs.model import OtherVehicle
from aiinfra_pipelines.vehicle.degradation import DEGRADED, MINIMAL_RISK, DegradationStatus

if TYPE_CHECKING:
    from aiinfra_pipelines.fleet.sim_env import EgoFootprint, EgoState

PERCEPTION_GROUND_TRUTH = "ground_truth"
PERCEPTION_ENGINE = "engine"


@dataclass(frozen=True)
class MetricsConfig:
    """What counts as a hard brake and how a bumper gap is measured.

    Defaults come from the vehicle-side trigger rules (``triggers.yaml``: ``hard_brake``
    threshold, ``low_ttc`` vehicle length), so "a hard brake" means the same on the car and in
    simulation unless a caller passes its own.
    """

    hard_brake_mps2: float
    vehicle_length_m: float

    @classmethod
    def from_triggers(cls, triggers: TriggerConfig | None = None) -> MetricsConfig:
        rules = (triggers or TriggerConfig.load()).rules
        return cls(
            hard_brake_mps2=float(rules["hard_brake"].threshold),
            vehicle_length_m=float(rules["low_ttc"].params["vehicle_length_m"]),
        )


# The parts of a closed-loop step, each timed on its own. env: the simulator's step and ego state;
# camera: render, resample to the camera's frames, degrade (and the LiDAR scan when recording);
# truth: the ground-truth read (it also paints plates into the frames); engine: the driven and
# shadow engines' inference; planner: the degradation monitor and the planners; metrics: the
# per-step trace the episode's metrics and collision classification are computed from.
STEP_PARTS = ("env", "camera", "truth", "engine", "planner", "metrics")


@dataclass
class EpisodeMetrics:
    """Per-episode outcome. Timing lists are wall-clock and vary run to run; everything else is
    a deterministic function of the setup, the engine and the configuration."""

    perception_source: str
    engine_name: str
    engine_sha256: str
    steps: int
    duration_s: float
    collision: bool
    collision_step: int | None
    min_ttc_s: float | None  # None: never closing in on a lead
    min_lead_gap_m: float | None  # None: never a lead in ego's lane
    progress_m: float
    mean_speed_mps: float
    hard_brakes: int
    max_abs_jerk_mps3: float
    rms_jerk_mps3: float
    fallback_steps: int
    fallback_activations: int
    decisions: dict[str, int]
    confidence: list[float]
    mean_confidence: float
    min_confidence: float
    events: list[dict[str, Any]]
    simulator_ms: list[float] = field(default_factory=list)
    perception_ms: list[float] = field(default_factory=list)
    planner_ms: list[float] = field(default_factory=list)
    # Where the episode's wall-clock went, summed over its steps (milliseconds per part, see
    # STEP_PARTS): what benchmarks/simulation.py reads to weigh an episode against its floor.
    step_profile_ms: dict[str, float] = field(default_factory=dict)
    # Shadow mode: a second engine perceived the same frames and planned without acting.
    shadow_engine_sha256: str = ""
    shadow_steps: int = 0
    shadow_agreements: int = 0  # steps where the shadow plan chose the driven action
    # The frame before the first collision, as :func:`collision_record` describes it.
    collision_detail: dict[str, Any] | None = None
    # The degradation state machine: every transition ({step, timestamp_ns from the episode's
    # start, from_state, to_state, cause, detail}), steps spent outside nominal, engine errors.
    degradation_transitions: list[dict[str, Any]] = field(default_factory=list)
    degraded_steps: int = 0
    minimal_risk_steps: int = 0
    engine_errors: int = 0

    # Per-step series (summarized by timing_summary), and every wall-clock field.
    TIMING_SERIES = ("simulator_ms", "perception_ms", "planner_ms")
    TIMING_FIELDS = (*TIMING_SERIES, "step_profile_ms")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def deterministic_dict(self) -> dict[str, Any]:
        """The outcome without wall-clock timings: equal for equal inputs, on any machine load."""
        return {k: v for k, v in asdict(self).items() if k not in self.TIMING_FIELDS}

    def timing_summary(self) -> dict[str, float]:
        """Mean / p95 / max per timing series, in milliseconds."""
        summary: dict[str, float] = {}
        for name in self.TIMING_SERIES:
            values = np.asarray(getattr(self, name), dtype=float)
            stem = name.removesuffix("_ms")
            if values.size == 0:
                continue
            summary[f"{stem}_mean_ms"] = float(values.mean())
            summary[f"{stem}_p95_ms"] = float(np.percentile(values, 95))
            summary[f"{stem}_max_ms"] = float(values.max())
        return summary


def lead_time_to_collision(
    others: Sequence[OtherVehicle], vehicle_length_m: float
) -> tuple[float, float]:
    """(bumper gap, time-to-collision) to the nearest lead in ego's lane; ``inf`` if none/never.

    Ground-truth ``vx`` is relative to ego, so a negative ``vx`` closes in (the same definition
    as the vehicle-side ``low_ttc`` trigger).
    """
    leads = [o for o in others if o.lane_offset == 0 and o.x > 0.0]
    if not leads:
        return math.inf, math.inf
    lead = min(leads, key=lambda o: o.x)
    gap = lead.x - vehicle_length_m
    if gap <= 0.0:
        return gap, 0.0
    closing = -lead.vx
    return gap, (gap / closing if closing > 0.0 else math.inf)


@dataclass
class EpisodeTrace:
    """What the loop accumulates step by step, turned into :class:`EpisodeMetrics` at the end."""

    speeds: list[float] = field(default_factory=list)
    crashed: list[bool] = field(default_factory=list)
    ttc: list[float] = field(default_factory=list)
    lead_gaps: list[float] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    fallbacks: list[bool] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    simulator_ms: list[float] = field(default_factory=list)
    perception_ms: list[float] = field(default_factory=list)
    planner_ms: list[float] = field(default_factory=list)
    step_profile_ms: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(STEP_PARTS, 0.0)
    )
    shadow_agreed: list[bool] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    engine_errors: int = 0
    footprints: list[EgoFootprint] = field(default_factory=list)
    previous_others: list[OtherVehicle] = field(default_factory=list)
    # (frame index of the first crash, the vehicle ego collided with as seen one frame before)
    crash: tuple[int, OtherVehicle | None] | None = None

    def spend(self, part: str, seconds: float) -> None:
        """Add ``seconds`` of wall-clock to one of :data:`STEP_PARTS`."""
        self.step_profile_ms[part] += seconds * 1e3

    def shadow(self, agreed: bool) -> None:
        self.shadow_agreed.append(bool(agreed))

    def degradation(self, step: int, status: DegradationStatus, engine_error: bool) -> None:
        self.states.append(status.state)
        self.engine_errors += int(engine_error)
        if status.transition is not None:
            self.transitions.append({"step": int(step), **status.transition.to_dict()})

    def observe(
        self,
        ego: EgoState,
        others: list[OtherVehicle],
        vehicle_length_m: float,
        *,
        footprint: EgoFootprint | None = None,
        crashed_ids: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        gap, ttc = lead_time_to_collision(others, vehicle_length_m)
        self.speeds.append(float(ego.speed_mps))
        self.crashed.append(bool(ego.crashed))
        self.lead_gaps.append(gap)
        self.ttc.append(ttc)
        if footprint is not None:
            self.footprints.append(footprint)
        if ego.crashed and self.crash is None:
            self.crash = (
                len(self.speeds) - 1,
                _collision_partner(others, self.previous_others, crashed_ids),
            )
        self.previous_others = others

    def decide(self, name: str, fallback: bool, confidence: float) -> None:
        self.decisions.append(name)
        self.fallbacks.append(bool(fallback))
        self.confidence.append(round(float(confidence), 6))

    def metrics(
        self,
        *,
        engine: Any | None,
        dt_s: float,
        hard_brake_mps2: float,
        events: list,
        shadow_engine: Any | None = None,
    ) -> EpisodeMetrics:
        speeds = np.asarray(self.speeds, dtype=float)
        accel = np.diff(speeds) / dt_s
        jerk = np.diff(accel) / dt_s
        hard = accel < hard_brake_mps2
        fallbacks = np.asarray(self.fallbacks, dtype=bool)
        crash_steps = [i for i, c in enumerate(self.crashed) if c]
        ttc = min(self.ttc, default=math.inf)
        gap = min(self.lead_gaps, default=math.inf)
        confidence = np.asarray(self.confidence, dtype=float)
        return EpisodeMetrics(
            perception_source=PERCEPTION_GROUND_TRUTH if engine is None else PERCEPTION_ENGINE,
            engine_name="" if engine is None else str(engine.name),
            engine_sha256="" if engine is None else str(engine.sha256),
            steps=len(self.decisions),
            duration_s=round(len(self.decisions) * dt_s, 6),
            collision=bool(crash_steps),
            collision_step=crash_steps[0] if crash_steps else None,
            min_ttc_s=None if math.isinf(ttc) else round(float(ttc), 6),
            min_lead_gap_m=None if math.isinf(gap) else round(float(gap), 6),
            progress_m=round(float(np.sum(speeds[:-1]) * dt_s), 6),
            mean_speed_mps=round(float(speeds.mean()) if speeds.size else 0.0, 6),
            hard_brakes=_onsets(hard),
            max_abs_jerk_mps3=round(float(np.abs(jerk).max()) if jerk.size else 0.0, 6),
            rms_jerk_mps3=round(float(np.sqrt(np.mean(jerk**2))) if jerk.size else 0.0, 6),
            fallback_steps=int(fallbacks.sum()),
            fallback_activations=_onsets(fallbacks),
            decisions={name: self.decisions.count(name) for name in ACTION_NAMES.values()},
            confidence=list(self.confidence),
            mean_confidence=round(float(confidence.mean()) if confidence.size else 0.0, 6),
            min_confidence=round(float(confidence.min()) if confidence.size else 0.0, 6),
            events=list(events),
            simulator_ms=self.simulator_ms,
            perception_ms=self.perception_ms,
            planner_ms=self.planner_ms,
            step_profile_ms={part: round(ms, 3) for part, ms in self.step_profile_ms.items()},
            shadow_engine_sha256="" if shadow_engine is None else str(shadow_engine.sha256),
            shadow_steps=len(self.shadow_agreed),
            shadow_agreements=int(sum(self.shadow_agreed)),
            collision_detail=self._collision_detail(dt_s),
            degradation_transitions=list(self.transitions),
            degraded_steps=self.states.count(DEGRADED),
            minimal_risk_steps=self.states.count(MINIMAL_RISK),
            engine_errors=self.engine_errors,
        )

    def _collision_detail(self, dt_s: float) -> dict[str, Any] | None:
        if self.crash is None:
            return None
        frame, partner = self.crash
        before = max(frame - 1, 0)  # the crash frame is already post-impact
        footprint = self.footprints[before] if len(self.footprints) > before else None
        return collision_record(
            step=frame,
            ego_speed_mps=self.speeds[before],
            ego_accel_mps2=(self.speeds[before] - self.speeds[before - 1]) / dt_s
            if before >= 1
            else 0.0,
            footprint=footprint,
            partner=partner,
        )


def _collision_partner(
    current: Sequence[OtherVehicle],
    previous: Sequence[OtherVehicle],
    crashed_ids: frozenset[int] | set[int],
) -> OtherVehicle | None:
    """The vehicle ego collided with, as it was one frame before the impact (when known).

    highway-env marks both vehicles of a collision crashed; of the crashed others, the one
    nearest ego now is the one it hit.
    """
    hits = [o for o in current if o.vehicle_id in crashed_ids]
    if not hits:
        return None
    nearest = min(hits, key=lambda o: math.hypot(o.x, o.y))
    before = {o.vehicle_id: o for o in previous}
    return before.get(nearest.vehicle_id, nearest)


def collision_record(
    *,
    step: int,
    ego_speed_mps: float,
    ego_accel_mps2: float,
    footprint: EgoFootprint | None,
    partner: OtherVehicle | None,
) -> dict[str, Any]:
    """A collision as plain data, measured the frame before impact (the impact frame is already
    shaped by the crash): ego speed and longitudinal acceleration, ego's size and whether it
    straddled a lane boundary, and the other vehicle's position, velocity relative to ego and
    absolute speed in ego's frame (x ahead, y left). ``partner`` is ``None`` when the vehicle
    ego hit is unknown (outside ground-truth range)."""
    record: dict[str, Any] = {
        "step": int(step),
        "ego_speed_mps": round(float(ego_speed_mps), 6),
        "ego_accel_mps2": round(float(ego_accel_mps2), 6),
        "ego_length_m": None if footprint is None else footprint.length_m,
        "ego_width_m": None if footprint is None else footprint.width_m,
        "ego_straddles_lanes": bool(footprint.straddles_lanes) if footprint else False,
        "partner": None,
    }
    if partner is not None:
        record["partner"] = {
            "x_m": round(float(partner.x), 6),
            "y_m": round(float(partner.y), 6),
            "vx_mps": round(float(partner.vx), 6),
            "vy_mps": round(float(partner.vy), 6),
            "speed_mps": round(math.hypot(ego_speed_mps + partner.vx, partner.vy), 6),
            "lane_offset": int(partner.lane_offset),
        }
    return record


def _onsets(flags: np.ndarray) -> int:
    """How many times a condition switched on (a run of consecutive steps counts once)."""
    if flags.size == 0:
        return 0
    previous = np.concatenate([[False], flags[:-1]])
    return int(np.sum(flags & ~previous))
