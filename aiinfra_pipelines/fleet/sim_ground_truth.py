"""Ground truth of the surrounding vehicles, and the licence plates painted on camera frames.

Part of the highway-env adapter (the ``sim_*`` modules, :mod:`.sim_env` first). It stands
apart from ego's own state because it carries per-episode identity (stable vehicle ids) and
draws into the images, which anonymization and the cloud's PII check then look for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.fleet.sim_lanes import lane_ahead, route_lane_offset, route_lanes
from aiinfra_pipelines.logs.model import OtherVehicle


@dataclass(frozen=True)
class _EgoFrame:
    """Ego's pose for one read: world (ENU) vectors turn into ego-frame (x ahead, y left)."""

    position: np.ndarray
    velocity: np.ndarray
    cos_h: float
    sin_h: float

    @classmethod
    def of(cls, ego: Any) -> _EgoFrame:
        heading = -float(ego.heading)
        return cls(_enu(ego.position), _enu(ego.velocity), math.cos(heading), math.sin(heading))

    def rotate(self, vector: np.ndarray) -> tuple[float, float]:
        """An ENU vector in ego's frame."""
        return (
            float(self.cos_h * vector[0] + self.sin_h * vector[1]),
            float(-self.sin_h * vector[0] + self.cos_h * vector[1]),
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
        frame = _EgoFrame.of(ego)
        lanes, first_lane_from = self._path_lanes(env, ego)
        others = []
        for vehicle in base.road.vehicles:
            if vehicle is ego:
                continue
            delta = _enu(vehicle.position) - frame.position
            if float(np.hypot(*delta)) > self._range_m:
                continue
            x, y = frame.rotate(delta)
            lane_offset = self._lane_offset(vehicle, y, lanes, first_lane_from)
            box = None
            if image is not None:
                box = self._paint_plate(image, self._camera, vehicle, ego, at_front=False)
            rear_box = None
            if rear_image is not None and rear_camera is not None:
                rear_box = self._paint_plate(rear_image, rear_camera, vehicle, ego, at_front=True)
            vx, vy = frame.rotate(_enu(vehicle.velocity) - frame.velocity)
            others.append(
                OtherVehicle(
                    vehicle_id=self._id_of(vehicle),
                    x=x,
                    y=y,
                    vx=vx,
                    vy=vy,
                    lane_offset=int(lane_offset),
                    plate_box=box,
                    rear_plate_box=rear_box,
                )
            )
        return others

    def _path_lanes(self, env: gym.Env, ego: Any) -> tuple[list[Any], float]:
        """The lanes of ego's path (fleet.yaml ``lane_assignment.path``), and from where along
        the first one a vehicle counts: ``behind_m`` back from ego, to see the cars behind."""
        if self._path == "route":
            lanes = route_lanes(env, self._range_m, self._max_route_lanes)
        else:
            lanes = lane_ahead(env, self._range_m)
        ego_longitudinal, _ = lanes[0].local_coordinates(ego.position)
        return lanes, min(0.0, float(ego_longitudinal) - self._behind_m)

    def _lane_offset(self, vehicle: Any, y: float, lanes: list[Any], first_lane_from: float) -> int:
        """The vehicle's lane against ego's path; beside no path lane, from its lateral ``y``."""
        lane_offset = route_lane_offset(
            vehicle.position,
            lanes,
            first_lane_from,
            self._seam_margin_m,
            body=vehicle.polygon()[:4],
        )
        if lane_offset is None:
            lane_offset = math.floor(y / float(lanes[0].width_at(0.0)) + 0.5)
        return lane_offset

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
    """A highway-env world vector (y down) in ENU (y north)."""
    return np.array([float(vector[0]), -float(vector[1])])
