"""Deterministic rule planner: perception in, highway-env meta-action out.

The same planner drives the simulated fleet (on ground-truth perception) and the closed-loop
regression (on the network's perception), so a regression is attributable to perception alone.
It is deliberately simple and auditable: a priority list of rules, thresholds from fleet.yaml.

Rule priority, first match wins:
1. fallback: confidence below ``min_confidence`` -> SLOWER, stay in lane (``fallback=True``);
2. brake: lead gap, time gap or time-to-collision below its minimum -> SLOWER;
3. overtake: lead within ``overtake_time_gap_s`` and an adjacent lane is free -> change lane
   (left preferred);
4. keep right: right lane free and no lead holding us back -> LANE_RIGHT (if ``keep_right``);
5. accelerate: road ahead free -> FASTER; otherwise IDLE (follow).

Time-to-collision needs the closing speed, which a single perception frame does not carry; the
planner estimates it from the change of ``lead_gap_m`` between consecutive calls. That is its
only state (plus a lane-change cooldown); call :meth:`RulePlanner.reset` between episodes.

Above the rules sits the car's degradation state (``vehicle.degradation``), which
:meth:`RulePlanner.act_in_state` obeys: ``nominal`` runs the rules (so a single low-confidence
frame still takes rule 1); ``degraded`` and a frame without perception (the engine raised) take
the conservative fallback, SLOWER in lane; ``minimal_risk`` keeps slowing, in lane, to a stop
(or the lowest speed the road's action space has).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from aiinfra_pipelines.fleet.perception import LEFT_ROW, RIGHT_ROW, Perception
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.vehicle.degradation import DEGRADED, MINIMAL_RISK, NOMINAL, STATES

# highway-env DiscreteMetaAction.ACTIONS_ALL (checked against highway_env in the tests; this
# module stays importable without the simulator so a car-side build can use it).
LANE_LEFT, IDLE, LANE_RIGHT, FASTER, SLOWER = 0, 1, 2, 3, 4
ACTION_NAMES: dict[int, str] = {
    LANE_LEFT: "LANE_LEFT",
    IDLE: "IDLE",
    LANE_RIGHT: "LANE_RIGHT",
    FASTER: "FASTER",
    SLOWER: "SLOWER",
}


@dataclass(frozen=True)
class PlannerDecision:
    """The chosen meta-action, its name, whether it is the low-confidence fallback, and why."""

    action: int
    name: str
    fallback: bool
    reason: str = ""


@dataclass(frozen=True)
class PlannerConfig:
    """Thresholds of the rule planner (fleet.yaml ``planner:``) plus the context it needs."""

    min_confidence: float
    min_gap_m: float
    min_time_gap_s: float
    min_ttc_s: float
    overtake_time_gap_s: float
    free_road_gap_m: float
    free_road_time_gap_s: float
    occupied_threshold: float
    lane_change_clear_m: float
    lane_change_cooldown_steps: int
    keep_right: bool
    min_speed_mps: float
    bin_edges_m: tuple[float, ...]
    max_range_m: float
    dt_s: float

    @classmethod
    def from_config(cls, config: FleetConfig | None = None) -> PlannerConfig:
        """Build from fleet.yaml: the ``planner`` section, perception bins, policy step."""
        cfg = fleet_config(config)
        section: Mapping[str, Any] = cfg["planner"]
        context = {
            "bin_edges_m": tuple(float(e) for e in cfg["perception"]["bin_edges_m"]),
            "max_range_m": float(cfg["perception"]["max_range_m"]),
            "dt_s": 1.0 / float(cfg["simulation"]["policy_frequency_hz"]),
        }
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in context:
                values[f.name] = context[f.name]
            else:
                values[f.name] = section[f.name]
        return cls(**values)


class RulePlanner:
    """Priority-rule planner; see the module docstring for the rules."""

    def __init__(self, config: PlannerConfig | FleetConfig | None = None) -> None:
        if not isinstance(config, PlannerConfig):
            config = PlannerConfig.from_config(config)
        self.config = config
        edges = np.asarray(self.config.bin_edges_m)
        # Bins that must be free for a lane change: every bin starting before the clear distance.
        self._clear_bins = np.flatnonzero(edges[:-1] < self.config.lane_change_clear_m)
        self.reset()

    def reset(self) -> None:
        """Forget the previous lead gap and lane-change cooldown (new episode)."""
        self._previous_gap: float | None = None
        self._cooldown = 0

    def act(self, perception: Perception, ego_speed: float) -> PlannerDecision:
        """Choose the next meta-action for ``perception`` at ``ego_speed`` (m/s)."""
        c = self.config
        closing = self._closing_speed(perception.lead_gap_m)
        self._previous_gap = perception.lead_gap_m
        self._cooldown = max(0, self._cooldown - 1)

        if perception.confidence < c.min_confidence:
            return _decide(SLOWER, "low perception confidence", fallback=True)

        gap = perception.lead_gap_m
        has_lead = gap < c.max_range_m
        time_gap = gap / max(ego_speed, c.min_speed_mps)
        ttc = gap / closing if closing > 0.0 else math.inf
        if has_lead and (gap < c.min_gap_m or time_gap < c.min_time_gap_s or ttc < c.min_ttc_s):
            return _decide(SLOWER, f"keep distance: gap {gap:.1f} m, ttc {ttc:.1f} s")

        blocked = has_lead and time_gap < c.overtake_time_gap_s
        if blocked and self._cooldown == 0:
            for row, action in ((LEFT_ROW, LANE_LEFT), (RIGHT_ROW, LANE_RIGHT)):
                if self._lane_free(perception, row):
                    self._cooldown = c.lane_change_cooldown_steps
                    return _decide(action, "overtake slow lead")
        if (
            c.keep_right
            and not blocked
            and self._cooldown == 0
            and self._lane_free(perception, RIGHT_ROW)
        ):
            self._cooldown = c.lane_change_cooldown_steps
            return _decide(LANE_RIGHT, "keep right")
        if gap >= c.free_road_gap_m and time_gap >= c.free_road_time_gap_s:
            return _decide(FASTER, "road ahead free")
        return _decide(IDLE, "follow lead")

    def act_in_state(
        self,
        state: str,
        perception: Perception | None,
        ego_speed: float,
        cause: str = "",
    ) -> PlannerDecision:
        """The action for the car's degradation ``state`` (``cause``: why it is there).

        ``perception`` is ``None`` when the engine produced nothing this frame. Outside
        ``nominal`` the rules do not run, but the lead gap is still tracked (so closing speed is
        right again on recovery) and the lane-change cooldown still runs down.
        """
        if state not in STATES:
            raise ValueError(f"unknown degradation state {state!r}; known: {list(STATES)}")
        if state == NOMINAL and perception is not None:
            return self.act(perception, ego_speed)
        self._previous_gap = None if perception is None else perception.lead_gap_m
        self._cooldown = max(0, self._cooldown - 1)
        why = f" ({cause})" if cause else ""
        if state == MINIMAL_RISK:
            return _decide(SLOWER, f"minimal risk{why}: slow to a stop in lane", fallback=True)
        if state == DEGRADED:
            return _decide(SLOWER, f"degraded{why}: conservative fallback", fallback=True)
        return _decide(SLOWER, "no perception this frame", fallback=True)

    def _lane_free(self, perception: Perception, row: int) -> bool:
        cells = perception.occupancy[row, self._clear_bins]
        return bool(np.all(cells < self.config.occupied_threshold))

    def _closing_speed(self, gap: float) -> float:
        """Rate at which the lead gap shrinks (m/s); 0 without a lead in both frames."""
        previous = self._previous_gap
        limit = self.config.max_range_m
        if previous is None or previous >= limit or gap >= limit:
            return 0.0
        return (previous - gap) / self.config.dt_s


def _decide(action: int, reason: str, fallback: bool = False) -> PlannerDecision:
    return PlannerDecision(action, ACTION_NAMES[action], fallback, reason)
