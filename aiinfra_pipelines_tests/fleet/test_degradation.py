"""Degradations move the image in the physically expected direction, deterministically."""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.degradation import box_blur, degrade
from aiinfra_pipelines.fleet.settings import fleet_config


@pytest.fixture
def scene() -> np.ndarray:
    """A high-contrast synthetic frame: gray road, white lane marks, bright plate, dark car."""
    rng = np.random.default_rng(0)
    image = np.full((48, 128, 3), 100, dtype=np.uint8)
    image[10:12, :, :] = 255
    image[30:34, 40:50, :] = (200, 200, 0)
    image[31:33, 38:40, :] = 255
    image += rng.integers(0, 20, size=image.shape, dtype=np.uint8)
    return image


def _rng() -> np.random.Generator:
    return np.random.default_rng(42)


def test_clear_day_is_identity(scene: np.ndarray) -> None:
    out = degrade(scene, "clear", "day", _rng())
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, scene)
    assert out is not scene


def test_night_is_darker_and_noisier(scene: np.ndarray) -> None:
    out = degrade(scene, "clear", "night", _rng())
    assert out.shape == scene.shape and out.dtype == np.uint8
    assert out.mean() < 0.6 * scene.mean()
    # Sensor noise: a flat region gets texture it did not have.
    flat = np.full_like(scene, 100)
    assert degrade(flat, "clear", "night", _rng()).std() > 1.0


def test_fog_reduces_contrast(scene: np.ndarray) -> None:
    out = degrade(scene, "fog", "day", _rng())
    assert out.std() < 0.6 * scene.std()


def test_rain_adds_streaks_and_blur(scene: np.ndarray) -> None:
    out = degrade(scene, "rain", "day", _rng())
    assert not np.array_equal(out, scene)
    # Blur softens the sharp lane-mark edge.
    edge_before = np.abs(np.diff(scene[:, :, 0].astype(float), axis=0)).max()
    edge_after = np.abs(np.diff(out[:, :, 0].astype(float), axis=0)[8:13]).max()
    assert edge_after < edge_before


def test_degradation_is_deterministic_given_rng(scene: np.ndarray) -> None:
    for weather in ("clear", "rain", "fog"):
        for lighting in ("day", "night"):
            a = degrade(scene, weather, lighting, _rng())
            b = degrade(scene, weather, lighting, _rng())
            np.testing.assert_array_equal(a, b)


def test_unknown_condition_is_rejected(scene: np.ndarray) -> None:
    with pytest.raises(ValueError):
        degrade(scene, "snow", "day", _rng())
    with pytest.raises(ValueError):
        degrade(scene, "clear", "dusk", _rng())


def test_box_blur_preserves_constant_and_mean() -> None:
    flat = np.full((8, 9, 3), 77.0, dtype=np.float32)
    np.testing.assert_allclose(box_blur(flat, 3), flat, atol=1e-4)
    impulse = np.zeros((9, 9, 1), dtype=np.float32)
    impulse[4, 4] = 9.0
    blurred = box_blur(impulse, 3)
    np.testing.assert_allclose(blurred[3:6, 3:6, 0], np.ones((3, 3)), atol=1e-5)
    assert blurred.sum() == pytest.approx(9.0)


def test_ego_headlights_light_the_road_ahead_at_night_and_nothing_behind() -> None:
    """The front camera's cone ahead is lit toward beam_gain, fading with distance; beside
    and behind ego, and everywhere in the rear camera, the night stays uniformly dark."""
    camera_cfg = fleet_config()["camera"]
    night = fleet_config()["degradation"]["night"]
    front = EgoCamera.from_config(camera_cfg)
    flat = np.full((front.height_px, front.width_px, 3), 200, dtype=np.uint8)
    lit = degrade(flat, "clear", "night", _rng(), camera=front).astype(float).mean(axis=2)
    dark = degrade(flat, "clear", "night", _rng()).astype(float).mean(axis=2)

    def pixel(ahead_m: float, left_m: float) -> tuple[int, int]:
        u = int(front.ego_u_px + ahead_m * front.scaling_px_per_m)
        v = int(front.ego_v_px - left_m * front.scaling_px_per_m)
        return v, u

    beam_range = float(night["beam_range_m"])
    near, far = pixel(10.0, 0.0), pixel(0.8 * beam_range, 0.0)
    assert lit[near] > lit[far] > dark[far] + 10  # lit, and fading with distance
    assert lit[near] == pytest.approx(200 * float(night["beam_gain"]), abs=40)
    for outside in (pixel(-10.0, 0.0), pixel(5.0, 15.0), pixel(beam_range + 10.0, 0.0)):
        assert lit[outside] == pytest.approx(dark[outside], abs=1e-6)  # same noise stream
    rear = EgoCamera.from_config(camera_cfg["rear"], front.scaling_px_per_m, yaw_deg=180.0)
    rear_flat = np.full((rear.height_px, rear.width_px, 3), 200, dtype=np.uint8)
    np.testing.assert_array_equal(
        degrade(rear_flat, "clear", "night", _rng(), camera=rear),
        degrade(rear_flat, "clear", "night", _rng()),
    )
    # Daylight is not touched by the beams.
    np.testing.assert_array_equal(degrade(flat, "clear", "day", _rng(), camera=front), flat)
