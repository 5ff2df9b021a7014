"""What counts as a safety event, once for the car and the simulation: at-fault collisions
(nuPlan's classification) and near misses (one time-to-collision rule).

The fleet's telemetry (``operations.telemetry``) and the regression simulation
(``simulation.runner``) both call :func:`episode_safety_events`, so a rollout's canary and the
simulation gate count the same events: being rear-ended while stopped is a collision but not an
at-fault one on either side, and a near miss is the same TTC or gap below the same threshold.

Who was at fault: nuPlan's collision classification over one recorded collision.

A collision counts against the planner only when ego caused it. The rules follow nuPlan's
``no_ego_at_fault_collisions`` metric, which sorts every collision into one type:

* ``stopped_ego`` — ego was (nearly) stationary: never at fault;
* ``stopped_track`` — ego, moving, hit a (nearly) stationary vehicle: at fault;
* ``active_front`` — ego's front ran into a moving vehicle (a slower lead, a car that cut in
  and braked): at fault;
* ``active_rear`` — a moving vehicle ran into ego's rear: not at fault in nuPlan. We add one
  exception, the brake check: ego braked harder than the comfort deceleration limit in the
  step before it was hit. A perception engine that sees a phantom obstacle and slams the
  brakes causes the rear-end; braking within comfort limits never does. The exception is a
  switch (``collisions.rear_end_after_harsh_brake_at_fault`` in simulation.yaml), off = pure
  nuPlan;
* ``active_lateral`` — the vehicles met side by side: ego is at fault when its footprint
  straddled a lane boundary (ego was changing lanes into the other car), not when the other
  car swerved into ego's lane;
* ``unknown`` — the vehicle ego hit is not in the ground truth: at fault, since nothing
  exonerates ego.

Front / rear / lateral comes from where the other vehicle was, in ego's frame, the frame
before impact: a contact is longitudinal when the other car's offset, measured in vehicle
lengths along ego's heading, exceeds its offset in vehicle widths across it.

A near miss is an episode without a collision whose minimum time-to-collision to the lead fell
below ``near_miss_ttc_s`` or whose bumper gap fell below ``near_miss_gap_m``.

Everything here is a pure function of the record ``fleet.episode_metrics.collision_record`` writes
and the thresholds in ``resources/simulation.yaml`` ``collisions:`` (the file the simulation's
other world rules live in; the car reads the same section); tests build collisions by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aiinfra_pipelines.config import settings_section

RULES_FILE = "simulation.yaml"


class CollisionType(StrEnum):
    STOPPED_EGO = "stopped_ego"
    STOPPED_TRACK = "stopped_track"
    ACTIVE_FRONT = "active_front"
    ACTIVE_REAR = "active_rear"
    ACTIVE_LATERAL = "active_lateral"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CollisionRules:
    """The thresholds of the classification (``simulation.yaml`` ``collisions:``)."""

    stopped_speed_mps: float
    comfort_decel_mps2: float
    rear_end_after_harsh_brake_at_fault: bool
    near_miss_ttc_s: float = 1.0
    near_miss_gap_m: float = 2.0

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> CollisionRules:
        section = settings_section(RULES_FILE, "collisions", config)
        decel = section.float("comfort_decel_mps2")
        if decel <= 0:
            raise section.error(
                "comfort_decel_mps2", f"is a deceleration magnitude (> 0), got {decel}"
            )
        return cls(
            stopped_speed_mps=section.float("stopped_speed_mps"),
            comfort_decel_mps2=decel,
            rear_end_after_harsh_brake_at_fault=section.bool("rear_end_after_harsh_brake_at_fault"),
            near_miss_ttc_s=section.float("near_miss_ttc_s"),
            near_miss_gap_m=section.float("near_miss_gap_m"),
        )


@dataclass(frozen=True)
class Partner:
    """The other vehicle, the frame before impact, in ego's frame (x ahead, y left)."""

    x_m: float
    y_m: float
    speed_mps: float


@dataclass(frozen=True)
class Collision:
    """What the classification needs of one collision (the frame before impact)."""

    ego_speed_mps: float
    ego_accel_mps2: float  # longitudinal; negative = braking
    ego_straddles_lanes: bool
    ego_length_m: float
    ego_width_m: float
    partner: Partner | None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Collision:
        """From ``EpisodeMetrics.collision_detail`` (``fleet.episode_metrics.collision_record``)."""
        partner = record.get("partner")
        length, width = record.get("ego_length_m"), record.get("ego_width_m")
        if length is None or width is None:
            raise ValueError(f"collision record without ego dimensions: {dict(record)}")
        return cls(
            ego_speed_mps=float(record["ego_speed_mps"]),
            ego_accel_mps2=float(record["ego_accel_mps2"]),
            ego_straddles_lanes=bool(record["ego_straddles_lanes"]),
            ego_length_m=float(length),
            ego_width_m=float(width),
            partner=None
            if partner is None
            else Partner(
                x_m=float(partner["x_m"]),
                y_m=float(partner["y_m"]),
                speed_mps=float(partner["speed_mps"]),
            ),
        )


@dataclass(frozen=True)
class CollisionVerdict:
    kind: CollisionType
    at_fault: bool
    reason: str


def classify_collision(collision: Collision, rules: CollisionRules) -> CollisionVerdict:
    """The collision's type and whether ego was at fault (see the module docstring)."""
    partner = collision.partner
    if partner is None:
        return CollisionVerdict(
            CollisionType.UNKNOWN, True, "the vehicle ego hit is not in the ground truth"
        )
    speed = collision.ego_speed_mps
    if speed <= rules.stopped_speed_mps:
        return CollisionVerdict(
            CollisionType.STOPPED_EGO, False, f"ego stopped ({speed:.2f} m/s) when hit"
        )
    if partner.speed_mps <= rules.stopped_speed_mps:
        return CollisionVerdict(
            CollisionType.STOPPED_TRACK, True, f"ego at {speed:.1f} m/s hit a stopped vehicle"
        )
    longitudinal = abs(partner.x_m) / collision.ego_length_m >= (
        abs(partner.y_m) / collision.ego_width_m
    )
    if longitudinal and partner.x_m > 0:
        return CollisionVerdict(
            CollisionType.ACTIVE_FRONT,
            True,
            f"ego at {speed:.1f} m/s ran into a vehicle at {partner.speed_mps:.1f} m/s ahead",
        )
    if longitudinal:
        braking = -collision.ego_accel_mps2
        harsh = braking > rules.comfort_decel_mps2
        if harsh and rules.rear_end_after_harsh_brake_at_fault:
            return CollisionVerdict(
                CollisionType.ACTIVE_REAR,
                True,
                f"rear-ended after braking at {braking:.1f} m/s² > comfort "
                f"{rules.comfort_decel_mps2:.2f} m/s²",
            )
        return CollisionVerdict(
            CollisionType.ACTIVE_REAR,
            False,
            f"rear-ended while braking at {max(braking, 0.0):.1f} m/s²"
            + (" (harsh, not counted)" if harsh else " (within comfort)"),
        )
    if collision.ego_straddles_lanes:
        return CollisionVerdict(
            CollisionType.ACTIVE_LATERAL, True, "ego changed lanes into the other vehicle"
        )
    return CollisionVerdict(
        CollisionType.ACTIVE_LATERAL, False, "the other vehicle moved into ego's lane"
    )


def fault_fields(metrics: Mapping[str, Any], rules: CollisionRules) -> dict[str, Any]:
    """``collision_type``, ``at_fault_collision`` and ``collision_fault`` (why) for one
    episode's metrics; an episode without a collision is not at fault."""
    if not metrics.get("collision"):
        return {"collision_type": None, "at_fault_collision": False, "collision_fault": None}
    detail = metrics.get("collision_detail")
    if detail is None:  # a collision nothing was recorded about: ego is not exonerated
        verdict = CollisionVerdict(CollisionType.UNKNOWN, True, "no collision record")
    else:
        verdict = classify_collision(Collision.from_record(detail), rules)
    return {
        "collision_type": str(verdict.kind),
        "at_fault_collision": verdict.at_fault,
        "collision_fault": verdict.reason,
    }


def is_near_miss(metrics: Mapping[str, Any], rules: CollisionRules) -> bool:
    """No collision, but the minimum TTC to the lead or the bumper gap fell below the rule's."""
    if metrics.get("collision"):
        return False
    ttc, gap = metrics.get("min_ttc_s"), metrics.get("min_lead_gap_m")
    return (ttc is not None and ttc < rules.near_miss_ttc_s) or (
        gap is not None and gap < rules.near_miss_gap_m
    )


def episode_safety_events(metrics: Mapping[str, Any], rules: CollisionRules) -> dict[str, Any]:
    """One episode's safety events: ``collisions`` and ``at_fault_collisions`` (0 or 1),
    ``near_misses`` (0 or 1), and the collision's type and why it was (not) ego's fault."""
    fault = fault_fields(metrics, rules)
    return {
        "collisions": int(bool(metrics.get("collision"))),
        "at_fault_collisions": int(bool(fault["at_fault_collision"])),
        "near_misses": int(is_near_miss(metrics, rules)),
        **fault,
    }
