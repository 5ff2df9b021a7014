"""Plates are blurred on the car before a log is written, and the cloud checks it on its own."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.fleet.conditions import Conditions
from aiinfra_pipelines.fleet.landing import land_batch
from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import drive_episode
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.logs.pii_check import find_residual_pii
from aiinfra_pipelines.logs.pii_detection import HaarCascadeDetector, region_contrast
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.vehicle.anonymizer import (
    AnonymizerSettings,
    SimulatorPlateDetector,
    VehicleAnonymizer,
    merge_overlapping,
)

pytestmark = pytest.mark.timeout(180)


def _pii_settings() -> dict:
    return load_resource_yaml("logs.yaml")["validation"]["pii_check"]


@pytest.fixture(scope="module")
def fleet_logs():
    """A clear-day highway drive (readable plates before the car's anonymizer), short."""
    config = with_overrides(
        None,
        {
            "simulation": {
                "road_types": {
                    "highway": {"max_duration_s": 6, "env_config": {"duration": 6}},
                }
            }
        },
    )
    vehicle = build_fleet(1, config=config)[0]
    conditions = Conditions("highway", "clear", "day", vehicle.city)
    logs = drive_episode(vehicle, 0, 4, conditions, config)
    assert logs, "the drive kept no segment"
    return logs


def test_the_raw_bytes_on_the_ingest_branch_carry_no_readable_plate(fleet_logs, local_lake):
    """What lands is what the car wrote: decode the landed bytes and look in every plate box."""
    batch = land_batch(
        local_lake, "anon", [(log.log_id, encode_drive_log(log)) for log in fleet_logs]
    )
    limit = float(_pii_settings()["max_region_contrast"])
    boxes = 0
    for key in batch.keys:
        landed = read_drive_log(local_lake.get_object(batch.branch, key))
        assert landed.metadata["anonymizer_version"].startswith("vehicle-anon-1+simulator_boxes")
        assert int(landed.metadata["anonymizer_regions_blurred"]) > 0
        for frame in landed.frames:
            for other in frame.others:
                for image, box in (
                    (frame.image, other.plate_box),
                    (frame.rear_image, other.rear_plate_box),
                ):
                    if box is not None and image is not None:
                        assert region_contrast(image, box) <= limit
                        boxes += 1
        assert find_residual_pii(landed, _pii_settings()) == []
    assert boxes > 0


def test_the_cloud_check_finds_every_plate_the_car_did_not_blur(fleet_logs):
    """The same frames before the car's anonymizer: the check names frames and regions."""
    raw = make_synthetic_log(n_frames=12, seed=3, vehicle_anonymized=False)
    findings = find_residual_pii(read_drive_log(encode_drive_log(raw)), _pii_settings())
    planted = sum(o.plate_box is not None for frame in raw.frames for o in frame.others)
    assert len(findings) == planted > 0
    assert {finding.found_by for finding in findings} == {"ground_truth_boxes"}
    first = findings[0]
    assert first.frame_index == 0 and first.kind == "plate" and first.camera == "front"
    assert first.box == raw.frames[0].others[0].plate_box
    assert first.contrast > float(_pii_settings()["max_region_contrast"])
    # Once through the car's anonymizer the same log is clean.
    blurred = VehicleAnonymizer([SimulatorPlateDetector()], "test").anonymize(raw)
    assert find_residual_pii(read_drive_log(encode_drive_log(blurred)), _pii_settings()) == []


def test_a_car_without_the_simulators_boxes_still_blurs_what_its_cascade_finds():
    """The pixel-only detector is real: a drawn face is found and flattened, nothing else."""
    settings = AnonymizerSettings.load()
    cascade_only = VehicleAnonymizer([HaarCascadeDetector(settings.haar_cascade)], "test")
    assert cascade_only.version == "test+haar_cascade"
    log = make_synthetic_log(n_frames=6, seed=2, image_height=128, image_width=160)
    image = log.frames[0].image.copy()
    image[16:112, 32:128] = _synthetic_face(96)[:, :, None]
    frame = dataclasses.replace(log.frames[0], image=image, others=[])
    faces = [region for region in cascade_only.regions(frame) if region.kind == "face"]
    assert len(faces) == 1
    x0, y0, x1, y1 = faces[0].box
    assert 16 <= (y0 + y1) / 2 <= 112 and 32 <= (x0 + x1) / 2 <= 128
    blurred, count = cascade_only.anonymize_frame(frame)
    assert count == 1
    assert region_contrast(blurred.image, faces[0].box) < 1e-3
    assert region_contrast(image, faces[0].box) > 20
    outside = np.ones(image.shape[:2], dtype=bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(blurred.image[outside], image[outside])
    # The plain synthetic frame (no face, no plate the cascade knows) is left alone.
    assert cascade_only.regions(log.frames[1]) == []


def _synthetic_face(side: int) -> np.ndarray:
    """A schematic frontal face (bright oval, dark eyes, brows, nose shadow and mouth)."""
    import cv2

    canvas = np.full((side, side), 40, np.uint8)
    centre = (side // 2, side // 2)
    cv2.ellipse(canvas, centre, (side * 3 // 8, side // 2 - 2), 0, 0, 360, 200, -1)
    for dx in (-1, 1):
        eye = (side // 2 + dx * side // 6, side * 2 // 5)
        cv2.ellipse(canvas, eye, (side // 12, side // 24), 0, 0, 360, 30, -1)
        brow = (side // 2 + dx * side // 6, side * 3 // 10)
        cv2.ellipse(canvas, brow, (side // 9, side // 40 + 1), 0, 0, 360, 70, -1)
    cv2.ellipse(canvas, (side // 2, side * 11 // 20), (side // 24, side // 10), 0, 0, 360, 140, -1)
    cv2.ellipse(canvas, (side // 2, side * 3 // 4), (side // 6, side // 24), 0, 0, 360, 60, -1)
    return cv2.GaussianBlur(canvas, (5, 5), 0)


def test_overlapping_detections_are_flattened_as_one_region():
    """Two plates whose boxes overlap: flattened one after the other, the first would keep two
    means (no glyph, but not flat); the car flattens their union, which the cloud accepts."""
    raw = make_synthetic_log(n_frames=6, seed=9, plates_per_frame=1, vehicle_anonymized=False)
    frame = raw.frames[0]
    (plate,) = frame.others
    x0, y0, x1, y1 = plate.plate_box
    shifted = (x0 + 4, y0 + 2, x1 + 4, y1 + 2)  # a second car's plate, half over the first
    image = frame.image.copy()
    image[shifted[1] : shifted[3], shifted[0] : shifted[2]] = 20  # dark, unlike the first
    second = dataclasses.replace(plate, vehicle_id=2, plate_box=shifted)
    frame = dataclasses.replace(frame, image=image, others=[plate, second])
    assert merge_overlapping([plate.plate_box, shifted]) == [(x0, y0, x1 + 4, y1 + 2)]
    assert merge_overlapping([(0, 0, 2, 2), (2, 0, 4, 2)]) == [(0, 0, 2, 2), (2, 0, 4, 2)]
    blurred, _ = VehicleAnonymizer([SimulatorPlateDetector()], "t").anonymize_frame(frame)
    log = dataclasses.replace(raw, frames=[blurred])
    assert find_residual_pii(log, _pii_settings()) == []
    assert region_contrast(blurred.image, plate.plate_box) == 0.0
