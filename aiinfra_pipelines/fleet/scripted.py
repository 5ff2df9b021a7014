"""Scripted traffic for closed-loop scenarios: aggressive cut-ins and slow leads in highway-env.

highway-env's own traffic is random (seeded) IDM/MOBIL vehicles; a regression scenario needs a
specific hazard to happen at a specific moment. We get it without patching highway-env, only by
placing and re-configuring vehicles of the configured other-vehicle class after ``reset``:

* **cut-in** — at reset a vehicle is placed in the lane beside ego, ``gap_m`` ahead (longitudinal
  centre distance), with MOBIL lane changes disabled so random lane changes cannot pre-empt the
  script, and its lane is cleared ahead of it for the distance it covers until ``at_s``. Until
  ``at_s`` it *paces* ego: every policy step its speed and IDM target speed are set to ego's, so
  the gap stays at ``gap_m`` whatever the planner does. At ``at_s`` its target lane
  becomes ego's lane (its own lateral controller steers it across, as for any highway-env lane
  change) and its target speed drops by ``speed_delta_mps`` — an aggressive cut-in that brakes
  in front of ego.
* **slow lead** — at reset a vehicle is placed in ego's lane ``gap_m`` ahead, driving at
  ``speed_mps`` with lane changes disabled; vehicles between ego and it are removed, so it *is*
  ego's lead. Optionally at ``brake_at_s`` its target speed drops to ``brake_to_mps`` and the IDM
  brakes (clipped at the class's ``ACC_MAX``) — a hard-braking lead.

Both clear random vehicles within ``clear_m`` of the placement in the target lane, so the placed
vehicle never starts inside another. Only straight multi-lane roads (where "the lane beside ego"
and "ahead in ego's lane" are well defined by lane ids) support them; the simulation layer
validates which road types may carry events. Everything is deterministic: placements derive
from ego's pose after the seeded reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the simulator is imported only where an episode runs
    import gymnasium as gym

SIDE_LEFT, SIDE_RIGHT = "left", "right"
# Ego may speed up while the cutter paces it: clear this multiple of the distance it would cover
# at ego's initial speed.
_PACING_REACH = 1.5


@dataclass(frozen=True)
class CutIn:
    """A vehicle beside ego that cuts into ego's lane at ``at_s`` (see the module docstring)."""

    at_s: float
    gap_m: float
    side: str = SIDE_LEFT
    speed_delta_mps: float = -5.0
    clear_m: float = 15.0

    kind = "cut_in"


@dataclass(frozen=True)
class SlowLead:
    """A slow vehicle ahead of ego in its lane, optionally braking hard at ``brake_at_s``."""

    gap_m: float
    speed_mps: float
    brake_at_s: float | None = None
    brake_to_mps: float | None = None
    clear_m: float = 15.0

    kind = "slow_lead"


ScriptedEvent = CutIn | SlowLead


@dataclass
class _Actor:
    event: ScriptedEvent
    vehicle: Any | None
    trigger_step: int | None
    triggered: bool = False


class ScriptedTraffic:
    """The scripted vehicles of one episode; call :meth:`before_step` before every ``env.step``.

    ``fired`` lists what actually happened (placement, trigger), step by step, so a scenario
    result can show that its hazard really occurred.
    """

    def __init__(
        self,
        env: gym.Env,
        events: tuple[ScriptedEvent, ...],
        policy_frequency_hz: float,
        vehicle_class_path: str,
    ) -> None:
        self._env = env
        from highway_env import utils as he_utils

        self._cls = he_utils.class_from_path(vehicle_class_path)
        self.fired: list[dict[str, Any]] = []
        self._actors = [self._place(event, policy_frequency_hz) for event in events]

    def before_step(self, step: int) -> None:
        """Pace and trigger the scripted vehicles for the action about to be applied."""
        ego = self._env.unwrapped.vehicle
        for actor in self._actors:
            if actor.vehicle is None:
                continue
            due = actor.trigger_step is not None and step >= actor.trigger_step
            if isinstance(actor.event, CutIn):
                if not actor.triggered and not due:
                    actor.vehicle.speed = float(ego.speed)  # pace ego: keep the gap
                    actor.vehicle.target_speed = float(ego.speed)
                elif not actor.triggered:
                    self._cut_in(actor, ego, step)
            elif due and not actor.triggered:
                actor.vehicle.target_speed = float(actor.event.brake_to_mps)
                actor.triggered = True
                self.fired.append({"event": "slow_lead_brake", "step": step})

    # ------------------------------------------------------------------------------ placing
    def _place(self, event: ScriptedEvent, rate_hz: float) -> _Actor:
        base = self._env.unwrapped
        ego = base.vehicle
        network = base.road.network
        origin, destination, ego_lane = ego.lane_index
        lane_count = len(network.graph[origin][destination])
        if isinstance(event, CutIn):
            lane_id = _adjacent_lane(ego_lane, lane_count, event.side)
            trigger = round(event.at_s * rate_hz)
            speed = float(ego.speed)
        else:
            lane_id = ego_lane
            trigger = None if event.brake_at_s is None else round(event.brake_at_s * rate_hz)
            speed = float(event.speed_mps)
        if lane_id is None:
            self.fired.append({"event": f"{event.kind}_skipped", "step": 0, "reason": "no lane"})
            return _Actor(event, None, None)
        lane_index = (origin, destination, lane_id)
        lane = network.get_lane(lane_index)
        ego_s = float(ego.lane.local_coordinates(ego.position)[0])
        target_s = ego_s + float(event.gap_m)
        if lane.length is not None and target_s > float(lane.length):
            self.fired.append(
                {"event": f"{event.kind}_skipped", "step": 0, "reason": "beyond the road piece"}
            )
            return _Actor(event, None, None)
        ahead = event.clear_m
        if isinstance(event, CutIn):  # the road the pacing cutter covers until it cuts in
            ahead += _PACING_REACH * float(ego.speed) * float(event.at_s)
        self._clear(lane_index, ego_s, target_s, event.clear_m, ahead, ego, event)
        vehicle = self._cls(
            base.road,
            lane.position(target_s, 0.0),
            heading=lane.heading_at(target_s),
            speed=speed,
            target_lane_index=lane_index,
            target_speed=speed,
            enable_lane_change=False,
        )
        base.road.vehicles.append(vehicle)
        self.fired.append(
            {"event": f"{event.kind}_placed", "step": 0, "lane_id": int(lane_id), "s_m": target_s}
        )
        return _Actor(event, vehicle, trigger)

    def _clear(
        self,
        lane_index: tuple,
        ego_s: float,
        target_s: float,
        behind_m: float,
        ahead_m: float,
        ego: Any,
        event: ScriptedEvent,
    ) -> None:
        """Remove random vehicles near the placement (and, for a lead, between ego and it)."""
        road = self._env.unwrapped.road
        lane = road.network.get_lane(lane_index)
        low = ego_s if isinstance(event, SlowLead) else target_s - behind_m
        high = target_s + ahead_m
        keep = []
        for vehicle in road.vehicles:
            if vehicle is ego or tuple(vehicle.lane_index) != tuple(lane_index):
                keep.append(vehicle)
                continue
            s = float(lane.local_coordinates(vehicle.position)[0])
            if not low - 1e-6 < s < high:
                keep.append(vehicle)
        road.vehicles[:] = keep

    def _cut_in(self, actor: _Actor, ego: Any, step: int) -> None:
        vehicle = actor.vehicle
        origin, destination, _ = vehicle.lane_index
        lanes = self._env.unwrapped.road.network.graph[origin][destination]
        ego_lane = int(ego.lane_index[2])
        if ego.lane_index[:2] != (origin, destination) or ego_lane >= len(lanes):
            self.fired.append({"event": "cut_in_skipped", "step": step, "reason": "ego moved on"})
            actor.triggered = True
            return
        vehicle.target_lane_index = (origin, destination, ego_lane)
        vehicle.target_speed = max(0.0, float(vehicle.speed) + float(actor.event.speed_delta_mps))
        actor.triggered = True
        gap = float(ego.lane.local_coordinates(vehicle.position)[0]) - float(
            ego.lane.local_coordinates(ego.position)[0]
        )
        self.fired.append({"event": "cut_in", "step": step, "gap_m": round(gap, 3)})


def _adjacent_lane(lane_id: int, lane_count: int, side: str) -> int | None:
    """The lane beside ``lane_id`` on ``side`` (highway-env counts lanes from the left), or the
    other side when that one does not exist; ``None`` on a one-lane road."""
    left, right = lane_id - 1, lane_id + 1
    order = (left, right) if side == SIDE_LEFT else (right, left)
    for candidate in order:
        if 0 <= candidate < lane_count:
            return candidate
    return None
