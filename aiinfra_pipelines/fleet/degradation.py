"""Weather and lighting as camera-image degradations (pure numpy, deterministic given an rng).

The simulator renders a clean image; conditions are what make perception hard, so they are
applied here to the pixels the perception model will see: night = low light gain + sensor
noise, except where ego's own headlights light the road ahead; rain = bright streaks + blur,
fog = contrast loss toward a gray veil. Weather is applied first and lighting last because
sensor noise comes from the sensor, after the scene's optics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config


def degrade(
    image: np.ndarray,
    weather: str,
    lighting: str,
    rng: np.random.Generator,
    config: FleetConfig | None = None,
    camera: EgoCamera | None = None,
) -> np.ndarray:
    """The camera image as seen under ``weather``/``lighting``; a new uint8 array.

    ``rng`` supplies streak positions and sensor noise, so the same rng state yields the same
    bytes (the fleet's determinism test relies on this). ``camera`` (the image's geometry)
    places ego's headlight beams at night; without it the night is uniformly dark.
    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an H x W x 3 uint8 image, got {image.dtype} {image.shape}")
    params = fleet_config(config)["degradation"]
    out = image.astype(np.float32)
    if weather == "rain":
        out = apply_rain(out, rng, params["rain"])
    elif weather == "fog":
        out = apply_fog(out, params["fog"])
    elif weather != "clear":
        raise ValueError(f"unknown weather {weather!r}")
    if lighting == "night":
        gain = None if camera is None else headlight_gain(camera, params["night"])
        out = apply_night(out, rng, params["night"], gain)
    elif lighting != "day":
        raise ValueError(f"unknown lighting {lighting!r}")
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def apply_night(
    image: np.ndarray,
    rng: np.random.Generator,
    p: Mapping[str, Any],
    gain: np.ndarray | None = None,
) -> np.ndarray:
    """Low light: scale intensities down (by ``gain`` per pixel, H x W, if given; else the
    uniform ``light_gain``), then add Gaussian sensor noise (float in/out)."""
    dark = image * (float(p["light_gain"]) if gain is None else gain[:, :, None])
    return dark + rng.normal(0.0, float(p["noise_sigma"]), size=image.shape)


def headlight_gain(camera: EgoCamera, p: Mapping[str, Any]) -> np.ndarray:
    """Per-pixel light gain at night (H x W): ``light_gain``, more where ego's beams reach.

    A car at night is not in the dark: its low beams light a cone of road ahead, and a night
    camera sees the car in front by them. The cone (``beam_half_angle_deg``, ``beam_range_m``)
    gets ``beam_gain`` at ego, falling off with the square of the distance to ``light_gain`` at
    the beams' range. A rear camera's pixels lie behind ego, outside the cone.
    """
    key = (
        camera,
        float(p["light_gain"]),
        float(p.get("beam_gain", p["light_gain"])),
        float(p.get("beam_range_m", 0.0)),
        float(p.get("beam_half_angle_deg", 0.0)),
    )
    return _headlight_gain(*key)


@lru_cache(maxsize=8)
def _headlight_gain(
    camera: EgoCamera, light_gain: float, beam_gain: float, range_m: float, half_angle_deg: float
) -> np.ndarray:
    ahead, left = camera.ground_points_m()
    distance = np.hypot(ahead, left)
    in_cone = (ahead > 0.0) & (np.abs(np.arctan2(left, ahead)) <= math.radians(half_angle_deg))
    falloff = np.clip(1.0 - (distance / range_m) ** 2, 0.0, 1.0) if range_m > 0 else 0.0
    gain = light_gain + (beam_gain - light_gain) * np.where(in_cone, falloff, 0.0)
    gain = gain.astype(np.float32)
    gain.setflags(write=False)
    return gain


def apply_rain(image: np.ndarray, rng: np.random.Generator, p: Mapping[str, Any]) -> np.ndarray:
    """Slanted bright streaks (drops on the lens), then a box blur (water film)."""
    out = image.copy()
    height, width = out.shape[:2]
    length = int(p["streak_length_px"])
    slant = float(p["streak_slant"])
    intensity = float(p["streak_intensity"])
    count = int(p["streak_count"])
    starts_y = rng.integers(0, height, size=count)
    starts_x = rng.integers(0, width, size=count)
    steps = np.arange(length)
    for y0, x0 in zip(starts_y, starts_x, strict=True):
        ys = y0 + steps
        xs = np.rint(x0 + slant * steps).astype(int)
        keep = (ys < height) & (xs >= 0) & (xs < width)
        out[ys[keep], xs[keep], :] += intensity
    return box_blur(out, int(p["blur_kernel_px"]))


def apply_fog(image: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    """Blend toward a uniform gray veil: the standard deviation shrinks by ``1 - density``."""
    density = float(p["density"])
    veiled = image * (1.0 - density) + float(p["gray_level"]) * density
    return box_blur(veiled, int(p["blur_kernel_px"]))


def box_blur(image: np.ndarray, kernel: int) -> np.ndarray:
    """Separable mean filter of side ``kernel`` with edge padding; ``kernel <= 1`` is identity."""
    if kernel <= 1:
        return image
    before = kernel // 2
    after = kernel - 1 - before
    out = image
    for axis in (0, 1):
        pad = [(0, 0)] * out.ndim
        pad[axis] = (before + 1, after)
        padded = np.pad(out, pad, mode="edge")
        csum = np.cumsum(padded, axis=axis, dtype=np.float64)
        upper = np.take(csum, np.arange(kernel, padded.shape[axis]), axis=axis)
        lower = np.take(csum, np.arange(0, padded.shape[axis] - kernel), axis=axis)
        out = ((upper - lower) / kernel).astype(np.float32)
    return out
