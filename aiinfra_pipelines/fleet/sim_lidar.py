"""Simulated LiDAR: a ring of beams traced against highway-env's vehicle and obstacle bodies.

Part of the highway-env adapter (the ``sim_*`` modules, :mod:`.sim_env` first); it stands
apart because it is a sensor model with its own geometry, used only when a recording rig
carries a LiDAR.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np


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
