"""The highway-env adapter: building environments and reading ego state and ground truth.

Everything that touches highway-env internals lives here and in the other ``sim_*`` modules,
so a highway-env upgrade stays inside them. Conventions at this boundary:

* highway-env's world frame is x forward along the road, y *down* in the rendered image (lane
  index grows to the right). Logs use ENU (x east, y north, heading counter-clockwise): we map
  ``east = x``, ``north = -y``, ``heading = -heading``, ``steering = -steering``, so positive
  steering turns left like in ISO 8855.
* Ground-truth vehicles are expressed in the ego frame (x ahead, y left) with positions *and
  velocities relative to ego*.
* Lane assignment of surrounding vehicles is in :mod:`.sim_lanes`, their ground truth and
  plates in :mod:`.sim_ground_truth`, the LiDAR model in :mod:`.sim_lidar`.
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

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config


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


def _wrap(angle: float) -> float:
    return math.atan2(math.sin(angle), math.cos(angle))


def road_type_settings(road_type: str, config: FleetConfig | None = None) -> Mapping[str, Any]:
    """The fleet.yaml block for one road type (env id, duration, speeds)."""
    return fleet_config(config)["simulation"]["road_types"][road_type]
