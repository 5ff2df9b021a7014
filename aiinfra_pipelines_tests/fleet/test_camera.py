"""The front camera turns with the car: what is ahead of ego is to the right of ego in the image."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import fleet_config

HEADINGS = [0.0, math.pi / 2, -math.pi / 2, 2.3, -2.9, math.pi]


@pytest.fixture(scope="module")
def camera() -> EgoCamera:
    return EgoCamera.from_config(fleet_config(None)["camera"])


def _canvas_with_marker(camera: EgoCamera, offset_m: np.ndarray, heading: float) -> np.ndarray:
    """A black canvas drawn for ``heading`` with one white 3x3 px marker at a world offset
    from ego."""
    side = camera.canvas_px
    canvas = np.zeros((side, side, 3), dtype=np.uint8)
    ego = camera.ego_on_canvas(heading)
    col, row = (ego + offset_m * camera.scaling_px_per_m).astype(int)
    canvas[row - 1 : row + 2, col - 1 : col + 2] = 255
    return canvas


@pytest.mark.parametrize("heading", HEADINGS)
def test_a_car_ahead_appears_right_of_ego_on_its_row_at_any_heading(
    camera: EgoCamera, heading: float
) -> None:
    # highway-env world coordinates: y is down, heading clockwise in the image.
    ahead_m, left_m = 30.0, 6.0
    forward = np.array([math.cos(heading), math.sin(heading)])
    left = np.array([math.sin(heading), -math.cos(heading)])
    image = camera.image_from_canvas(
        _canvas_with_marker(camera, ahead_m * forward + left_m * left, heading), heading
    )
    assert image.shape == (camera.height_px, camera.width_px, 3)
    rows, cols = np.nonzero(image[..., 0])
    assert rows.size > 0, "the marker must be inside the image"
    scale = camera.scaling_px_per_m
    assert np.mean(cols) == pytest.approx(camera.ego_u_px + ahead_m * scale, abs=1.5)
    assert np.mean(rows) == pytest.approx(camera.ego_v_px - left_m * scale, abs=1.5)


@pytest.mark.parametrize("heading", HEADINGS)
def test_to_pixels_agrees_with_the_resampled_image(camera: EgoCamera, heading: float) -> None:
    offset = np.array([12.0, -7.0])
    image = camera.image_from_canvas(_canvas_with_marker(camera, offset, heading), heading)
    (u, v) = camera.to_pixels(offset[None, :], np.zeros(2), heading)[0]
    rows, cols = np.nonzero(image[..., 0])
    assert np.mean(cols) == pytest.approx(u, abs=1.5)
    assert np.mean(rows) == pytest.approx(v, abs=1.5)


@pytest.mark.parametrize("heading", [*HEADINGS, 0.4, 1.1, -0.7])
def test_the_canvas_holds_the_whole_image_at_every_heading(
    camera: EgoCamera, heading: float
) -> None:
    """Every image corner maps inside the canvas: nothing is sampled from outside the render."""
    forward = np.array([math.cos(heading), math.sin(heading)])
    left = np.array([math.sin(heading), -math.cos(heading)])
    scale = camera.scaling_px_per_m
    ego = camera.ego_on_canvas(heading)
    for u in (0.0, camera.width_px):
        for v in (0.0, camera.height_px):
            ahead_m, left_m = (u - camera.ego_u_px) / scale, (camera.ego_v_px - v) / scale
            x, y = ego + (ahead_m * forward + left_m * left) * scale
            assert 0 <= x <= camera.canvas_px and 0 <= y <= camera.canvas_px
    assert camera.centering(heading) == pytest.approx(list(ego / camera.canvas_px))


def test_a_canvas_of_another_size_is_refused(camera: EgoCamera) -> None:
    with pytest.raises(ValueError, match="square"):
        camera.image_from_canvas(np.zeros((10, 12, 3), dtype=np.uint8), 0.0)
    with pytest.raises(ValueError, match="px square"):
        camera.image_from_canvas(np.zeros((10, 10, 3), dtype=np.uint8), 0.0)


@pytest.mark.parametrize("road_type", ["roundabout", "intersection"])
def test_plates_sit_where_ground_truth_puts_the_cars_in_the_ego_frame(road_type: str) -> None:
    """The logged ego-frame positions (x ahead, y left) and the image agree on curved roads."""
    from aiinfra_pipelines.fleet.sim_env import (
        isolated_behaviour_class,
        make_env,
        render_frame,
    )
    from aiinfra_pipelines.fleet.sim_ground_truth import GroundTruthReader

    config = fleet_config(None)
    camera = EgoCamera.from_config(config["camera"])
    checked = 0
    with isolated_behaviour_class(config):
        env = make_env(road_type, 5, config)
        reader = GroundTruthReader(config)
        try:
            for _ in range(30):
                image = render_frame(env, camera)
                for other in reader.read(env, image):
                    if other.plate_box is None:
                        continue
                    x0, y0, x1, y1 = other.plate_box
                    u = camera.ego_u_px + other.x * camera.scaling_px_per_m
                    v = camera.ego_v_px - other.y * camera.scaling_px_per_m
                    # The plate is at the car's rear: within a car length of its centre.
                    assert abs((x0 + x1) / 2 - u) < 5.0 * camera.scaling_px_per_m
                    assert abs((y0 + y1) / 2 - v) < 5.0 * camera.scaling_px_per_m
                    checked += 1
                env.step(1)
        finally:
            env.close()
    assert checked > 0
