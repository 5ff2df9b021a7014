"""The front camera: a top-down view that turns with the car, as a real front camera does.

highway-env's renderer draws the world axis-aligned around the ego car. A camera bolted to the
car looks along its heading: in roundabouts and intersections, where the car drives north or
south, the world-aligned view put the road ahead on the image's short axis and lost the lead
car in ~60 % of the frames that had one (docs/training.md). So highway-env renders a square,
world-aligned *canvas* centred on the image's footprint (ego sits off-centre: the camera looks
75 m ahead and 25 m back), just large enough to contain that footprint at any heading, and the
camera image is resampled from it in the ego frame: ego at ``centering_position`` of the
image, its heading pointing right (+u), its left pointing up. Centring the canvas on the
footprint rather than on ego halves the pixels highway-env draws (178² instead of 254²).

Resampling is a nearest-neighbour gather: the image's pixel centres in the ego frame are
computed once per camera, each frame only rotates them by the heading (~10k points), far
cheaper than rendering.

Conventions: positions here are highway-env world coordinates (x right, y *down* in pixels);
headings are highway-env's (clockwise in the image). The ENU mapping lives in ``sim_env``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from aiinfra_pipelines.config import settings_section


@dataclass(frozen=True)
class EgoCamera:
    """The camera's geometry: image size, scale, where ego sits in it, and the canvas side."""

    width_px: int
    height_px: int
    scaling_px_per_m: float
    ego_u_px: float
    ego_v_px: float
    # Where the camera looks relative to ego's heading (pi: a rear camera looking back).
    yaw_offset_rad: float = 0.0

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> EgoCamera:
        """The front camera of ``fleet.yaml`` (or of ``config``, that whole file as a mapping)."""
        return cls.from_config(settings_section("fleet.yaml", "camera", config).values)

    @classmethod
    def from_config(
        cls, camera: Mapping[str, Any], scaling_px_per_m: float | None = None, yaw_deg: float = 0.0
    ) -> EgoCamera:
        """From fleet.yaml's ``camera`` block (``centering_position``: ego's place in the image).

        A derived camera (the rear one) has no scale of its own: it is resampled from the front
        camera's canvas, so it takes that ``scaling_px_per_m``.
        """
        width, height = int(camera["width_px"]), int(camera["height_px"])
        centre_u, centre_v = (float(c) for c in camera["centering_position"])
        scale = float(camera["scaling_px_per_m"] if scaling_px_per_m is None else scaling_px_per_m)
        return cls(
            width_px=width,
            height_px=height,
            scaling_px_per_m=scale,
            ego_u_px=centre_u * width,
            ego_v_px=centre_v * height,
            yaw_offset_rad=math.radians(yaw_deg),
        )

    @property
    def footprint_centre_m(self) -> tuple[float, float]:
        """The image centre's ground point in ego's frame (metres ahead, metres left)."""
        ahead = (self.width_px / 2.0 - self.ego_u_px) / self.scaling_px_per_m
        left = (self.ego_v_px - self.height_px / 2.0) / self.scaling_px_per_m
        cos_y, sin_y = math.cos(self.yaw_offset_rad), math.sin(self.yaw_offset_rad)
        return ahead * cos_y - left * sin_y, ahead * sin_y + left * cos_y

    def fits_canvas_of(self, primary: EgoCamera) -> bool:
        """Whether this camera's image lies inside ``primary``'s canvas at every heading.

        Both footprints turn with ego, so the distance from the primary footprint's centre (the
        canvas centre) to each corner of this image does not depend on the heading.
        """
        centre = np.array(primary.footprint_centre_m)
        reach_m = (primary.canvas_px / 2.0 - 2.0) / primary.scaling_px_per_m
        cos_y, sin_y = math.cos(self.yaw_offset_rad), math.sin(self.yaw_offset_rad)
        for u in (0.0, float(self.width_px)):
            for v in (0.0, float(self.height_px)):
                ahead = (u - self.ego_u_px) / self.scaling_px_per_m
                left = (self.ego_v_px - v) / self.scaling_px_per_m
                corner = np.array([ahead * cos_y - left * sin_y, ahead * sin_y + left * cos_y])
                if float(np.hypot(*(corner - centre))) > reach_m:
                    return False
        return True

    @property
    def canvas_px(self) -> int:
        """Side of the square world-aligned render that holds the image at every heading.

        Twice the distance from the image centre to a corner, plus two pixels of margin on
        each side for rounding; even.
        """
        reach = math.hypot(self.width_px / 2.0, self.height_px / 2.0)
        side = 2 * math.ceil(reach) + 4
        return side + side % 2

    def ego_on_canvas(self, heading: float) -> np.ndarray:
        """Canvas pixel (x, y) where ego is drawn so that the image footprint is centred."""
        forward, left = self._axes(heading)
        ahead_m = (self.width_px / 2.0 - self.ego_u_px) / self.scaling_px_per_m
        left_m = (self.ego_v_px - self.height_px / 2.0) / self.scaling_px_per_m
        footprint_centre = ahead_m * forward + left_m * left
        return self.canvas_px / 2.0 - footprint_centre * self.scaling_px_per_m

    def centering(self, heading: float) -> list[float]:
        """highway-env ``centering_position`` (fractions of the canvas) that draws ego at
        :meth:`ego_on_canvas`."""
        return [float(c) for c in self.ego_on_canvas(heading) / self.canvas_px]

    def sees(self, ahead_m: float, left_m: float) -> bool:
        """Whether a point at ego-frame (``ahead_m``, ``left_m``) lies inside the image."""
        u, v = self._image_point(ahead_m, left_m)
        return 0.0 <= u < self.width_px and 0.0 <= v < self.height_px

    def _image_point(self, ahead_m: Any, left_m: Any) -> tuple[Any, Any]:
        """Image pixel (u, v) of ego-frame metres ahead / left (scalars or arrays)."""
        scale = self.scaling_px_per_m
        return self.ego_u_px + ahead_m * scale, self.ego_v_px - left_m * scale

    @cached_property
    def _pixel_centres_m(self) -> tuple[np.ndarray, np.ndarray]:
        """The image's pixel centres in ego-frame metres: (ahead per column, left per row)."""
        scale = self.scaling_px_per_m
        ahead = (np.arange(self.width_px) + 0.5 - self.ego_u_px) / scale
        leftward = (self.ego_v_px - (np.arange(self.height_px) + 0.5)) / scale
        return ahead, leftward

    def ground_points_m(self) -> tuple[np.ndarray, np.ndarray]:
        """Every pixel centre's ground point in ego's frame: (metres ahead, metres left), H x W.

        Rotated by the camera's yaw, so a rear camera's pixels lie behind ego (negative ahead).
        """
        ahead, leftward = self._pixel_centres_m
        cam_ahead, cam_left = np.meshgrid(ahead, leftward)
        cos_y, sin_y = math.cos(self.yaw_offset_rad), math.sin(self.yaw_offset_rad)
        return cam_ahead * cos_y - cam_left * sin_y, cam_ahead * sin_y + cam_left * cos_y

    def _axes(self, heading: float) -> tuple[np.ndarray, np.ndarray]:
        """Unit vectors of ego's forward and left directions in highway-env world coordinates."""
        cos_h, sin_h = math.cos(heading), math.sin(heading)
        return np.array([cos_h, sin_h]), np.array([sin_h, -cos_h])

    def image_from_canvas(
        self, canvas: np.ndarray, heading: float, ego_on_canvas: np.ndarray | None = None
    ) -> np.ndarray:
        """The camera image (H x W x 3 uint8) resampled from a canvas with ego drawn at
        :meth:`ego_on_canvas` (rendered with :meth:`centering`).

        A derived camera (the rear one) passes the rendering camera's ``ego_on_canvas``: it
        reuses that canvas, so a second view costs one gather, not a second render.
        """
        side = canvas.shape[0]
        if canvas.shape[1] != side:
            raise ValueError(f"canvas must be square, got {canvas.shape[:2]}")
        if ego_on_canvas is None and side != self.canvas_px:
            raise ValueError(f"canvas must be {self.canvas_px} px square, got {side}")
        forward, left = self._axes(heading + self.yaw_offset_rad)
        scale = self.scaling_px_per_m
        ahead, leftward = self._pixel_centres_m
        world_x = ahead[None, :] * forward[0] + leftward[:, None] * left[0]
        world_y = ahead[None, :] * forward[1] + leftward[:, None] * left[1]
        ego_x, ego_y = self.ego_on_canvas(heading) if ego_on_canvas is None else ego_on_canvas
        cols = np.clip(np.floor(ego_x + world_x * scale).astype(np.intp), 0, side - 1)
        rows = np.clip(np.floor(ego_y + world_y * scale).astype(np.intp), 0, side - 1)
        return np.ascontiguousarray(canvas[rows, cols])

    def to_pixels(self, points: np.ndarray, ego_position: np.ndarray, heading: float) -> np.ndarray:
        """Image pixel coordinates (u, v) of world points (N x 2, highway-env coordinates)."""
        forward, left = self._axes(heading + self.yaw_offset_rad)
        delta = np.asarray(points, dtype=float) - np.asarray(ego_position, dtype=float)
        return np.stack(self._image_point(delta @ forward, delta @ left), axis=-1)
