"""Which lane a surrounding vehicle is in, relative to ego's path through highway-env's road.

Part of the highway-env adapter (the ``sim_*`` modules, :mod:`.sim_env` first), kept apart
because lane assignment is geometry with its own history of getting it wrong:

``lane_offset`` comes from the other vehicle's lateral coordinate along ego's path
(fleet.yaml ``ground_truth.lane_assignment``): by default the lane ego is on, over that
lane's own length, then straight on from its end (:func:`lane_ahead`, what a camera can
tell without knowing where ego means to turn); optionally the lanes ego's planned route
continues into (:func:`route_lanes`). A vehicle whose body reaches into ego's lane is in it
(a car crossing the junction ahead blocks the lane with its nose before its centre
arrives), and one beside no path lane gets its offset from its ego-frame lateral position.
Projecting onto the current lane alone (fleet-3) was wrong off straight roads: a circular
lane's coordinates put every car at the arc's radius, anywhere around the circle, "in ego's
lane" (in junctions 43 % of the near "ego lane" cars sat 2.5-19 m to the side).
"""

from __future__ import annotations

import math
import os
from typing import Any

# highway-env draws with pygame; headless machines need the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import gymnasium as gym
import numpy as np
from highway_env.road.lane import StraightLane


def lane_ahead(env: gym.Env, ahead_m: float) -> list[Any]:
    """Ego's lane, then straight on from its end along its final heading, for ``ahead_m``.

    What the camera can tell without knowing where ego means to go: the lane it is in (a
    junction's turn arc only over the arc itself) and the road straight ahead beyond it.
    """
    lane = env.unwrapped.vehicle.lane
    end = lane.position(lane.length, 0.0)
    heading = float(lane.heading_at(lane.length))
    direction = np.array([math.cos(heading), math.sin(heading)])
    straight_on = StraightLane(end, end + ahead_m * direction, width=lane.width_at(lane.length))
    return [lane, straight_on]


def route_lanes(env: gym.Env, ahead_m: float, max_lanes: int) -> list[Any]:
    """Ego's lane and the lanes its planned route continues into, until ``ahead_m`` is covered.

    highway-env's own ``next_lane`` picks the continuation (the planned route where ego has one,
    else the geometrically closest lane); it pops the route it is given, so it gets a copy.
    """
    base = env.unwrapped
    ego = base.vehicle
    network = base.road.network
    index = ego.lane_index
    lanes = [network.get_lane(index)]
    seen = {index}
    longitudinal, _ = lanes[0].local_coordinates(ego.position)
    covered = float(lanes[0].length) - float(longitudinal)
    route = list(getattr(ego, "route", None) or [])
    position = ego.position
    while covered < ahead_m and len(lanes) < max_lanes:
        # Where ego has left its planned route (a lane change in the ring), follow the road
        # geometry instead; highway-env would log a warning per call for the stale route.
        if route and route[0][:2] == index[:2]:
            route.pop(0)
        if route and route[0][0] != index[1]:
            route = []
        index = network.next_lane(index, route=route, position=position)
        if index in seen:
            break
        seen.add(index)
        lane = network.get_lane(index)
        lanes.append(lane)
        covered += float(lane.length)
        position = lane.position(0.0, 0.0)
    return lanes


def route_lane_offset(
    position: np.ndarray,
    lanes: list[Any],
    first_lane_from_m: float,
    margin_m: float,
    body: np.ndarray | None = None,
) -> int | None:
    """The lane offset (+1 left) of a vehicle at ``position`` against the route ``lanes``.

    A lane counts only over its own length (plus ``margin_m`` at the seams; the current lane
    from ``first_lane_from_m``, which may reach back before its start to see cars behind ego);
    the lane the vehicle's centre is laterally closest to wins. A vehicle whose ``body``
    (corner points) reaches into ego's lane is in ego's lane whatever its centre says: a car
    crossing the junction ahead, or cutting in, blocks the lane with its nose long before its
    centre arrives, and that is what the camera shows and the planner must brake for.
    ``None`` when no route lane is beside the centre or the body.
    """
    centre = _point_lane_offset(position, lanes, first_lane_from_m, margin_m)
    if centre != 0 and body is not None:
        for corner in body:
            if _point_lane_offset(corner, lanes, first_lane_from_m, margin_m) == 0:
                return 0
    return centre


def _point_lane_offset(
    point: np.ndarray, lanes: list[Any], first_lane_from_m: float, margin_m: float
) -> int | None:
    best: tuple[float, int] | None = None
    for i, lane in enumerate(lanes):
        longitudinal, lateral = lane.local_coordinates(point)
        lower = first_lane_from_m if i == 0 else -margin_m
        if not lower <= float(longitudinal) <= float(lane.length) + margin_m:
            continue
        width = float(lane.width_at(longitudinal))
        offset = -math.floor(float(lateral) / width + 0.5)
        if best is None or abs(float(lateral)) < best[0]:
            best = (abs(float(lateral)), offset)
    return None if best is None else best[1]
