"""The front camera: a top-down view that turns with the car, as a real front camera does.

highway-env's renderer draws the world axis-aligned around the ego car. A camera bolted to the
car looks along its heading: in roundabouts and intersections, where the car drives north or
south, the world-aligned view put the road ahead on the image's short axis and lost the lead
car in ~60 % of the frames that had one (docs/training.md). So highway-env renders a square,
world-aligned *canvas* centred on ego, large enough to contain the camera's footprint at any
heading, and the camera image is resampled from it in the ego frame: ego at
``centering_position`` of the image, its heading pointing right (+u), its left pointing up.

Resampling is a nearest-neighbour gather through a pre-computed grid (one rotation per frame,
~10k pixels), far cheaper than rendering.

Conventions: positions here are highway-env world coordinates (x right, y *down* in pixels);
headings are highway-env's (clockwise in the image). The ENU mapping lives in ``sim_env``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EgoCamera:
    """The camera's geometry: image size, scale, where ego sits in it, and the canvas side."""

    width_px: int
    height_px: int
    scaling_px_per_m: float
    ego_u_px: float
    ego_v_px: float

    @classmethod
    def from_config(cls, camera: Mapping[str, Any]) -> EgoCamera:
        """From fleet.yaml's ``camera`` block (``centering_position``: ego's place in the image)."""
        width, height = int(camera["width_px"]), int(camera["height_px"])
        centre_u, centre_v = (float(c) for c in camera["centering_position"])
        return cls(
            width_px=width,
            height_px=height,
            scaling_px_per_m=float(camera["scaling_px_per_m"]),
            ego_u_px=centre_u * width,
            ego_v_px=centre_v * height,
        )

    @property
    def canvas_px(self) -> int:
        """Side of the square world-aligned render that holds the image at every heading.

        Twice the distance from ego to the image's farthest corner, plus a pixel of margin on
        each side for rounding; even, so that ego sits exactly at the canvas centre.
        """
        reach = max(
            math.hypot(u - self.ego_u_px, v - self.ego_v_px)
            for u in (0.0, float(self.width_px))
            for v in (0.0, float(self.height_px))
        )
        side = 2 * math.ceil(reach) + 4
        return side + side % 2

    def sees(self, ahead_m: float, left_m: float) -> bool:
        """Whether a point at ego-frame (``ahead_m``, ``left_m``) lies inside the image."""
        scale = self.scaling_px_per_m
        u = self.ego_u_px + ahead_m * scale
        v = self.ego_v_px - left_m * scale
        return 0.0 <= u < self.width_px and 0.0 <= v < self.height_px

    def _axes(self, heading: float) -> tuple[np.ndarray, np.ndarray]:
        """Unit vectors of ego's forward and left directions in highway-env world coordinates."""
        cos_h, sin_h = math.cos(heading), math.sin(heading)
        return np.array([cos_h, sin_h]), np.array([sin_h, -cos_h])

    def image_from_canvas(self, canvas: np.ndarray, heading: float) -> np.ndarray:
        """The camera image (H x W x 3 uint8) resampled from a canvas centred on ego."""
        side = canvas.shape[0]
        if canvas.shape[1] != side:
            raise ValueError(f"canvas must be square, got {canvas.shape[:2]}")
        forward, left = self._axes(heading)
        scale = self.scaling_px_per_m
        # Pixel centres of the image, in metres ahead of / left of ego.
        ahead = (np.arange(self.width_px) + 0.5 - self.ego_u_px) / scale
        leftward = (self.ego_v_px - (np.arange(self.height_px) + 0.5)) / scale
        world_x = ahead[None, :] * forward[0] + leftward[:, None] * left[0]
        world_y = ahead[None, :] * forward[1] + leftward[:, None] * left[1]
        centre = side / 2.0
        cols = np.clip(np.floor(centre + world_x * scale).astype(np.intp), 0, side - 1)
        rows = np.clip(np.floor(centre + world_y * scale).astype(np.intp), 0, side - 1)
        return np.ascontiguousarray(canvas[rows, cols])

    def to_pixels(self, points: np.ndarray, ego_position: np.ndarray, heading: float) -> np.ndarray:
        """Image pixel coordinates (u, v) of world points (N x 2, highway-env coordinates)."""
        forward, left = self._axes(heading)
        delta = np.asarray(points, dtype=float) - np.asarray(ego_position, dtype=float)
        scale = self.scaling_px_per_m
        u = self.ego_u_px + (delta @ forward) * scale
        v = self.ego_v_px - (delta @ left) * scale
        return np.stack([u, v], axis=-1)
