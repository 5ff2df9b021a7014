"""The highway-env adapter: building environments and reading ego state and ground truth.

Everything that touches highway-env internals lives here, so a highway-env upgrade is a
one-file change. Conventions at this boundary:

* highway-env's world frame is x forward along the road, y *down* in the rendered image (lane
  index grows to the right). Logs use ENU (x east, y north, heading counter-clockwise): we map
  ``east = x``, ``north = -y``, ``heading = -heading``, ``steering = -steering``, so positive
  steering turns left like in ISO 8855.
* Ground-truth vehicles are expressed in the ego frame (x ahead, y left) with positions *and
  velocities relative to ego*.
* ``lane_offset`` comes from the other vehicle's lateral coordinate along ego's path
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
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# highway-env draws with pygame; headless machines need the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import gymnasium as gym
import highway_env  # noqa: F401  (import registers the highway-env environments)
import numpy as np
from highway_env import utils as he_utils
from highway_env.envs.common.graphics import EnvViewer
from highway_env.road.lane import StraightLane

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.logs.model import OtherVehicle


@dataclass(frozen=True)
class EgoState:
    """The ego vehicle at one policy step, already in log (ENU) conventions."""

    east_m: float
    north_m: float
    heading_rad: float
    speed_mps: float
    steering_rad: float
    lane_index: int
    lane_count: int
    road_edge: str
    crashed: bool


def env_config(road_type: str, config: FleetConfig | None = None) -> dict[str, Any]:
    """The highway-env ``config`` dict for ``road_type``, built from fleet.yaml.

    All road types share one action space (DiscreteMetaAction with lateral and longitudinal
    actions: intersection-v0 defaults to longitudinal only) and one camera. highway-env renders
    the camera's square, world-aligned canvas (``camera.EgoCamera``); :func:`render_frame`
    moves ego off-centre each frame so the canvas centres on the image footprint.
    """
    cfg = fleet_config(config)
    sim = cfg["simulation"]
    road = sim["road_types"][road_type]
    camera = EgoCamera.from_config(cfg["camera"])
    settings: dict[str, Any] = {
        "observation": dict(sim["observation"]),
        "action": {
            "type": "DiscreteMetaAction",
            "longitudinal": True,
            "lateral": True,
            "target_speeds": [float(s) for s in road["target_speeds_mps"]],
        },
        "policy_frequency": int(sim["policy_frequency_hz"]),
        "simulation_frequency": int(sim["simulation_frequency_hz"]),
        "other_vehicles_type": str(sim["other_vehicles_type"]),
        "screen_width": camera.canvas_px,
        "screen_height": camera.canvas_px,
        "scaling": camera.scaling_px_per_m,
        "centering_position": [0.5, 0.5],
        "offscreen_rendering": True,
        "show_trajectories": False,
        "real_time_rendering": False,
    }
    settings.update(dict(road.get("env_config") or {}))
    if settings["simulation_frequency"] % settings["policy_frequency"]:
        raise ValueError("simulation_frequency_hz must be a multiple of policy_frequency_hz")
    return settings


@contextmanager
def isolated_behaviour_class(config: FleetConfig | None = None) -> Iterator[None]:
    """Restore the other-vehicle class's constants after an episode.

    intersection-v0 overwrites class attributes of the IDM model (DISTANCE_WANTED, comfort
    accelerations) for the whole process; without this, a highway episode would drive
    differently depending on whether an intersection episode ran before it, breaking
    determinism under the seed.
    """
    cls = he_utils.class_from_path(str(fleet_config(config)["simulation"]["other_vehicles_type"]))
    missing = object()
    names = [n for n in dir(cls) if n.isupper()]
    saved = {n: cls.__dict__.get(n, missing) for n in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                if name in cls.__dict__:
                    delattr(cls, name)
            else:
                setattr(cls, name, value)


def make_env(road_type: str, seed: int, config: FleetConfig | None = None) -> gym.Env:
    """A reset, seeded, rendering highway-env environment for ``road_type``.

    Call inside :func:`isolated_behaviour_class` and close it when done.
    """
    road = fleet_config(config)["simulation"]["road_types"][road_type]
    with warnings.catch_warnings():
        # "merge-v0 is out of date": v0 is the variant with the geometry we document.
        warnings.simplefilter("ignore", DeprecationWarning)
        env = gym.make(
            str(road["env_id"]),
            render_mode="rgb_array",
            config=env_config(road_type, config),
            disable_env_checker=True,
        )
    env.reset(seed=seed)
    base = env.unwrapped
    # highway-env disables drawing entirely under SDL's dummy driver; we render offscreen into
    # a plain surface, which works headless, so switch drawing back on.
    viewer = EnvViewer(base)
    viewer.enabled = True
    base.viewer = viewer
    return env


def render_canvas(env: gym.Env, camera: EgoCamera) -> tuple[np.ndarray, float]:
    """The world-aligned canvas around the camera's footprint, and ego's heading.

    ``env.render()`` also arms highway-env's "automatic rendering" of every intermediate
    physics step during the next ``env.step``; those frames are never recorded, so disarm it
    (it would double the rendering cost).
    """
    heading = float(env.unwrapped.vehicle.heading)
    env.unwrapped.viewer.sim_surface.centering_position = camera.centering(heading)
    canvas = env.render()
    env.unwrapped.enable_auto_render = False
    return canvas, heading


def render_frame(env: gym.Env, camera: EgoCamera) -> np.ndarray:
    """The front camera image of the current state (a fresh, writable H x W x 3 uint8 array)."""
    canvas, heading = render_canvas(env, camera)
    return camera.image_from_canvas(canvas, heading)


class Lidar:
    """A ring of beams against highway-env's vehicle and obstacle bodies: LiDAR returns.

    The same model as highway-env's ``LidarObservation`` (each beam's range to the nearest
    solid body's rectangle, nothing beyond ``range_m``), computed for all beams and body edges
    at once in numpy: ``LidarObservation.trace`` loops over beams in Python and cost ~2 ms a
    step, a sixth of the whole drive step. A beam that hits nothing returns no point, as a real
    LiDAR's would. Points are (x ahead, y left, z up) metres in the lidar's frame at ego's
    centre (its mounting height is the static transform's).
    """

    def __init__(self, beams: int, range_m: float) -> None:
        self._range_m = float(range_m)
        angles = np.arange(int(beams)) * (2.0 * math.pi / int(beams))
        self._directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # world, y down

    def _edges(self, env: gym.Env, origin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, direction) of every edge of every solid body that can be in range."""
        base = env.unwrapped
        starts, vectors = [], []
        for body in [*base.road.vehicles, *base.road.objects]:
            if body is base.vehicle or not getattr(body, "solid", True):
                continue
            if float(np.hypot(*(body.position - origin))) > self._range_m + float(body.LENGTH):
                continue
            corners = np.asarray(body.polygon()[:4], dtype=float)
            starts.append(corners)
            vectors.append(np.roll(corners, -1, axis=0) - corners)
        if not starts:
            return np.zeros((0, 2)), np.zeros((0, 2))
        return np.concatenate(starts), np.concatenate(vectors)

    def scan(self, env: gym.Env) -> np.ndarray:
        """N x 3 float32 returns of the current state."""
        ego = env.unwrapped.vehicle
        origin = np.asarray(ego.position, dtype=float)
        starts, edges = self._edges(env, origin)
        d = self._directions
        distances = np.full(len(d), self._range_m)
        if len(starts):
            w = starts - origin  # (M, 2)
            den = d[:, None, 0] * edges[None, :, 1] - d[:, None, 1] * edges[None, :, 0]
            with np.errstate(divide="ignore", invalid="ignore"):
                t = (w[:, 0] * edges[:, 1] - w[:, 1] * edges[:, 0])[None, :] / den
                u = (w[None, :, 0] * d[:, None, 1] - w[None, :, 1] * d[:, None, 0]) / den
            valid = (den != 0) & (t >= 0) & (u >= 0) & (u <= 1)
            distances = np.minimum(distances, np.where(valid, t, np.inf).min(axis=1))
        hit = distances < self._range_m
        world = d[hit] * distances[hit, None]
        heading = float(ego.heading)
        forward = np.array([math.cos(heading), math.sin(heading)])
        left = np.array([math.sin(heading), -math.cos(heading)])  # y is down in highway-env
        points = np.zeros((int(hit.sum()), 3), dtype=np.float32)
        points[:, 0] = world @ forward
        points[:, 1] = world @ left
        return points


@dataclass(frozen=True)
class EgoFootprint:
    """Ego's body as a collision sees it: its size, and whether it spans a lane boundary.

    ``straddles_lanes`` is nuPlan's "ego is in multiple lanes": a lateral collision is ego's
    fault when it happens while ego's footprint crosses into a neighbouring lane (changing
    lanes), not when another car swerves into ego keeping its lane.
    """

    length_m: float
    width_m: float
    straddles_lanes: bool


def ego_footprint(env: gym.Env) -> EgoFootprint:
    """Ego's size (highway-env's own vehicle dimensions) and lane-boundary straddling."""
    ego = env.unwrapped.vehicle
    length, width = float(ego.LENGTH), float(ego.WIDTH)
    longitudinal, lateral = ego.lane.local_coordinates(ego.position)
    relative = float(ego.heading) - float(ego.lane.heading_at(longitudinal))
    # Half the footprint's extent across the lane, for a body rotated against the lane.
    half_extent = abs(length / 2.0 * math.sin(relative)) + abs(width / 2.0 * math.cos(relative))
    half_lane = float(ego.lane.width_at(longitudinal)) / 2.0
    return EgoFootprint(
        length_m=length,
        width_m=width,
        straddles_lanes=bool(abs(float(lateral)) + half_extent > half_lane),
    )


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


def ego_state(env: gym.Env) -> EgoState:
    """Read the controlled vehicle's kinematics and lane in ENU conventions."""
    base = env.unwrapped
    ego = base.vehicle
    start, end, lane_id = ego.lane_index
    lanes = base.road.network.graph[start][end]
    lane_count = len(lanes)
    # Forbidden lanes (merge-v0's on-ramp) are not drivable for ego: do not count them.
    while lane_count - 1 > lane_id and lanes[lane_count - 1].forbidden:
        lane_count -= 1
    return EgoState(
        east_m=float(ego.position[0]),
        north_m=float(-ego.position[1]),
        heading_rad=_wrap(-float(ego.heading)),
        speed_mps=float(ego.speed),
        steering_rad=-float(ego.action.get("steering", 0.0)),
        lane_index=int(lane_id),
        lane_count=int(lane_count),
        road_edge=f"{start}->{end}",
        crashed=bool(ego.crashed),
    )


class GroundTruthReader:
    """Surrounding vehicles as ``OtherVehicle`` records, with stable per-episode ids."""

    def __init__(self, config: FleetConfig | None = None) -> None:
        cfg = fleet_config(config)
        self._range_m = float(cfg["ground_truth"]["range_m"])
        assignment = cfg["ground_truth"]["lane_assignment"]
        self._behind_m = float(assignment["behind_m"])
        self._seam_margin_m = float(assignment["seam_margin_m"])
        self._max_route_lanes = int(assignment["max_route_lanes"])
        self._path = str(assignment["path"])
        if self._path not in ("lane_ahead", "route"):
            raise ValueError(f"lane_assignment.path must be lane_ahead or route, got {self._path}")
        self._plate = cfg["camera"]["plate"]
        self._camera = EgoCamera.from_config(cfg["camera"])
        self._ids: dict[int, int] = {}
        self._alive: list[object] = []  # keep objects referenced so id() is never reused

    def read(
        self,
        env: gym.Env,
        image: np.ndarray | None = None,
        rear_image: np.ndarray | None = None,
        rear_camera: EgoCamera | None = None,
    ) -> list[OtherVehicle]:
        """Vehicles within range; paints their plates into ``image`` (from ``render_frame``).

        Plate boxes go through the camera's world-to-pixel mapping at ego's current pose, so
        they line up with the rendered frame. With a ``rear_image`` (of ``rear_camera``) the
        front plates of the cars it sees are painted there too, and boxed for anonymization.
        """
        base = env.unwrapped
        ego = base.vehicle
        heading = -float(ego.heading)
        cos_h, sin_h = math.cos(heading), math.sin(heading)
        ego_pos = _enu(ego.position)
        ego_vel = _enu(ego.velocity)
        if self._path == "route":
            lanes = route_lanes(env, self._range_m, self._max_route_lanes)
        else:
            lanes = lane_ahead(env, self._range_m)
        ego_longitudinal, _ = lanes[0].local_coordinates(ego.position)
        first_lane_from = min(0.0, float(ego_longitudinal) - self._behind_m)
        others = []
        for vehicle in base.road.vehicles:
            if vehicle is ego:
                continue
            delta = _enu(vehicle.position) - ego_pos
            if float(np.hypot(*delta)) > self._range_m:
                continue
            rel_vel = _enu(vehicle.velocity) - ego_vel
            x = float(cos_h * delta[0] + sin_h * delta[1])
            y = float(-sin_h * delta[0] + cos_h * delta[1])
            lane_offset = route_lane_offset(
                vehicle.position,
                lanes,
                first_lane_from,
                self._seam_margin_m,
                body=vehicle.polygon()[:4],
            )
            if lane_offset is None:
                lane_offset = math.floor(y / float(lanes[0].width_at(0.0)) + 0.5)
            box = None
            if image is not None:
                box = self._paint_plate(image, self._camera, vehicle, ego, at_front=False)
            rear_box = None
            if rear_image is not None and rear_camera is not None:
                rear_box = self._paint_plate(rear_image, rear_camera, vehicle, ego, at_front=True)
            others.append(
                OtherVehicle(
                    vehicle_id=self._id_of(vehicle),
                    x=x,
                    y=y,
                    vx=float(cos_h * rel_vel[0] + sin_h * rel_vel[1]),
                    vy=float(-sin_h * rel_vel[0] + cos_h * rel_vel[1]),
                    lane_offset=int(lane_offset),
                    plate_box=box,
                    rear_plate_box=rear_box,
                )
            )
        return others

    def crashed_ids(self, env: gym.Env) -> set[int]:
        """Ids (as :meth:`read` gives them) of the other vehicles highway-env marked crashed.

        highway-env flags both vehicles of a collision, so the one ego hit is among these.
        """
        base = env.unwrapped
        return {
            self._id_of(vehicle)
            for vehicle in base.road.vehicles
            if vehicle is not base.vehicle and bool(getattr(vehicle, "crashed", False))
        }

    def _id_of(self, vehicle: object) -> int:
        key = id(vehicle)
        if key not in self._ids:
            self._ids[key] = len(self._ids) + 1
            self._alive.append(vehicle)
        return self._ids[key]

    def _paint_plate(
        self, image: np.ndarray, camera: EgoCamera, vehicle: Any, ego: Any, at_front: bool
    ) -> tuple[int, int, int, int] | None:
        box = self._plate_box(vehicle, ego, image.shape[1], image.shape[0], camera, at_front)
        if box is not None:
            paint_plate(image, box, self._plate, self._id_of(vehicle))
        return box

    def _plate_box(
        self,
        vehicle: Any,
        ego: Any,
        width_px: int,
        height_px: int,
        camera: EgoCamera | None = None,
        at_front: bool = False,
    ) -> tuple[int, int, int, int] | None:
        """Pixel box ``(x0, y0, x1, y1)``, end-exclusive, of the plate at the vehicle's rear
        (``at_front``: its front plate, what a rear camera sees of the cars behind)."""
        h = float(vehicle.heading)
        forward = np.array([math.cos(h), math.sin(h)])
        side = np.array([-math.sin(h), math.cos(h)])
        end = 1.0 if at_front else -1.0
        rear = np.asarray(vehicle.position, dtype=float) + end * forward * vehicle.LENGTH / 2.0
        half_w = float(self._plate["width_m"]) / 2.0
        depth = float(self._plate["depth_m"])
        corners = np.array(
            [rear + s * half_w * side - end * d * forward for s in (-1, 1) for d in (0.0, depth)]
        )
        camera = camera or self._camera
        pixels = camera.to_pixels(corners, np.asarray(ego.position), float(ego.heading))
        x0, y0 = np.floor(pixels.min(axis=0)).astype(int)
        x1, y1 = np.ceil(pixels.max(axis=0)).astype(int)
        min_size = int(self._plate["min_size_px"])
        x1, y1 = max(x1, x0 + min_size), max(y1, y0 + min_size)
        x0, x1 = max(0, int(x0)), min(width_px, int(x1))
        y0, y1 = max(0, int(y0)), min(height_px, int(y1))
        if x1 <= x0 or y1 <= y0:
            return None
        return int(x0), int(y0), int(x1), int(y1)


def paint_plate(
    image: np.ndarray, box: tuple[int, int, int, int], plate: Mapping[str, Any], number: int
) -> None:
    """A readable plate at ``box``: the plate colour with dark glyph pixels on it.

    The glyphs are what makes a plate personal data, so they are what anonymization must
    remove and what the cloud's check looks for: a flattened plate has no contrast left in its
    box. Every ``glyph_period``-th pixel along the diagonal is a glyph, shifted by the vehicle's
    ``number`` so that two plates do not read alike.
    """
    x0, y0, x1, y1 = box
    region = image[y0:y1, x0:x1]
    region[...] = np.asarray(plate["color_rgb"], dtype=np.uint8)
    period = int(plate["glyph_period"])
    rows, cols = np.indices(region.shape[:2])
    region[(rows + cols + number) % period == 0] = np.asarray(plate["glyph_rgb"], dtype=np.uint8)


def _enu(vector: Any) -> np.ndarray:
    return np.array([float(vector[0]), -float(vector[1])])


def _wrap(angle: float) -> float:
    return math.atan2(math.sin(angle), math.cos(angle))


def road_type_settings(road_type: str, config: FleetConfig | None = None) -> Mapping[str, Any]:
    """The fleet.yaml block for one road type (env id, duration, speeds)."""
    return fleet_config(config)["simulation"]["road_types"][road_type]
