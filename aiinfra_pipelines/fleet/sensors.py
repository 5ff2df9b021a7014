"""The simulated car's sensor rig: a rear camera, a LiDAR, their calibration and mounting.

A real car records several cameras and a LiDAR, compressed, with each sensor's calibration.
The simulated fleet does the same at little cost: the rear camera is resampled from the canvas
the front camera already rendered (one gather, no second render), the LiDAR is highway-env's
own ring of beams against the other vehicles' bodies (``sim_lidar.Lidar``), and the calibration
follows from the camera geometry in fleet.yaml — the top-down view is exactly a pinhole
``virtual_height_m`` above the ground looking down, so K and the extrinsics are consistent with
the pixels. Everything here only *describes* the rig (:class:`~aiinfra_pipelines.logs.rig.
Recording`); capturing happens in the closed loop, writing in ``logs.writer``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.logs.rig import CameraSensor, Intrinsics, Recording, StaticTransform


@dataclass(frozen=True)
class LidarSpec:
    """The ring of beams: count, range and where the sensor sits (fleet.yaml ``lidar``)."""

    beams: int
    range_m: float
    mount_height_m: float
    frame_id: str


@dataclass(frozen=True)
class SensorRig:
    """Every sensor a simulated car records besides the front camera, from fleet.yaml."""

    front: EgoCamera
    rear: EgoCamera | None
    lidar: LidarSpec | None
    image_encoding: str
    jpeg_quality: int
    front_frame_id: str
    rear_frame_id: str
    base_frame_id: str
    virtual_height_m: float
    skewed_vehicles: frozenset[int]
    skew_role: str
    skew_ns: int

    @classmethod
    def from_config(cls, config: FleetConfig | None = None) -> SensorRig:
        cfg = fleet_config(config)
        camera = cfg["camera"]
        front = EgoCamera.from_config(camera)
        rear_cfg = camera["rear"]
        rear = None
        if bool(rear_cfg["enabled"]):
            rear = EgoCamera.from_config(
                rear_cfg, front.scaling_px_per_m, yaw_deg=float(rear_cfg["yaw_deg"])
            )
            if not rear.fits_canvas_of(front):
                raise ValueError(
                    "fleet.yaml camera.rear: a "
                    f"{rear.width_px}x{rear.height_px} rear view does not fit inside the front "
                    f"camera's {front.canvas_px} px canvas at every heading; make it smaller"
                )
        lidar_cfg = cfg["lidar"]
        lidar = None
        if bool(lidar_cfg["enabled"]):
            lidar = LidarSpec(
                beams=int(lidar_cfg["beams"]),
                range_m=float(lidar_cfg["range_m"]),
                mount_height_m=float(lidar_cfg["mount_height_m"]),
                frame_id=str(lidar_cfg["frame_id"]),
            )
        skew = cfg["faults"]["clock_skew"]
        return cls(
            front=front,
            rear=rear,
            lidar=lidar,
            image_encoding=str(camera["encoding"]),
            jpeg_quality=int(camera["jpeg_quality"]),
            front_frame_id=str(camera["frame_id"]),
            rear_frame_id=str(rear_cfg["frame_id"]),
            base_frame_id=str(lidar_cfg["base_frame_id"]),
            virtual_height_m=float(camera["virtual_height_m"]),
            skewed_vehicles=frozenset(int(v) for v in skew["vehicles"] or []),
            skew_role=str(skew["role"]),
            skew_ns=round(float(skew["offset_ms"]) * 1e6),
        )

    def intrinsics(self, camera: EgoCamera) -> Intrinsics:
        """K of the downward pinhole that sees the ground at the camera's scale."""
        focal = camera.scaling_px_per_m * self.virtual_height_m
        cx, cy = camera.width_px / 2.0, camera.height_px / 2.0
        return Intrinsics(
            width=camera.width_px,
            height=camera.height_px,
            k=(focal, 0.0, cx, 0.0, focal, cy, 0.0, 0.0, 1.0),
        )

    def camera_transform(self, camera: EgoCamera, frame_id: str) -> StaticTransform:
        """The camera above its footprint's centre, looking down; image u along its yaw.

        Camera axes (x right in the image = ahead along the yaw, y down in the image = to the
        right of it, z into the ground) are a half turn about x after the yaw: the quaternion
        ``(cos(yaw/2), sin(yaw/2), 0, 0)``.
        """
        ahead, left = camera.footprint_centre_m
        half = camera.yaw_offset_rad / 2.0
        return StaticTransform(
            parent=self.base_frame_id,
            child=frame_id,
            translation=(float(ahead), float(left), self.virtual_height_m),
            rotation=(math.cos(half), math.sin(half), 0.0, 0.0),
        )

    def recording_for(self, vehicle_index: int, sensor_config_version: str) -> Recording:
        """One car's :class:`Recording` (a skewed clock where fleet.yaml ``faults`` says so)."""
        cameras = {"front": CameraSensor(self.front_frame_id, self.intrinsics(self.front))}
        transforms = [self.camera_transform(self.front, self.front_frame_id)]
        if self.rear is not None:
            cameras["rear"] = CameraSensor(self.rear_frame_id, self.intrinsics(self.rear))
            transforms.append(self.camera_transform(self.rear, self.rear_frame_id))
        if self.lidar is not None:
            transforms.append(
                StaticTransform(
                    parent=self.base_frame_id,
                    child=self.lidar.frame_id,
                    translation=(0.0, 0.0, self.lidar.mount_height_m),
                    rotation=(0.0, 0.0, 0.0, 1.0),
                )
            )
        offsets: Mapping[str, int] = (
            {self.skew_role: self.skew_ns} if vehicle_index in self.skewed_vehicles else {}
        )
        return Recording(
            sensor_config_version=sensor_config_version,
            image_encoding=self.image_encoding,
            jpeg_quality=self.jpeg_quality,
            cameras=cameras,
            lidar_frame_id=self.lidar.frame_id if self.lidar is not None else "lidar",
            transforms=tuple(transforms),
            clock_offsets_ns=dict(offsets),
        )


def rig_summary(rig: SensorRig) -> dict[str, Any]:
    """What the rig records, for benchmark and CLI output."""
    return {
        "encoding": rig.image_encoding,
        "jpeg_quality": rig.jpeg_quality,
        "rear_camera": None if rig.rear is None else f"{rig.rear.width_px}x{rig.rear.height_px}",
        "lidar_beams": None if rig.lidar is None else rig.lidar.beams,
    }
