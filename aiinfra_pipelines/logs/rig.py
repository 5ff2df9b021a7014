"""How a car records beyond the front camera: camera encoding, calibration, static transforms.

A real car compresses its cameras, carries several of them and a LiDAR, and states each
sensor's calibration (intrinsics per camera, extrinsics as static transforms) so that a log can
be fused across sensors. :class:`Recording` is that description as the writer needs it; the
fleet builds one per vehicle from ``fleet.yaml``. The calibration hash is computed from the
*decoded messages* (:func:`calibration_sha256`), so the same function serves the simulated
fleet and every real recording, and two logs with the same hash were calibrated alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

IMAGE_ENCODINGS = ("jpeg", "raw")
# Roles whose header stamps a fault can shift (the simulator's injected clock skew).
SKEWABLE_ROLES = ("front_camera", "rear_camera", "lidar", "gnss", "pose", "vehicle_status")


@dataclass(frozen=True)
class Intrinsics:
    """A pinhole camera's calibration as ``foxglove.CameraCalibration`` carries it."""

    width: int
    height: int
    k: tuple[float, ...]  # 3 x 3, row-major
    d: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)
    distortion_model: str = "plumb_bob"

    @property
    def p(self) -> tuple[float, ...]:
        """The 3 x 4 projection of an undistorted, unrectified camera: ``[K | 0]``."""
        k = self.k
        return (k[0], k[1], k[2], 0.0, k[3], k[4], k[5], 0.0, k[6], k[7], k[8], 0.0)


@dataclass(frozen=True)
class StaticTransform:
    """Where a sensor sits on the car: ``child`` in ``parent`` (metres, quaternion x y z w)."""

    parent: str
    child: str
    translation: tuple[float, float, float]
    rotation: tuple[float, float, float, float]


@dataclass(frozen=True)
class CameraSensor:
    """One camera: its frame id (images and calibration share it) and intrinsics."""

    frame_id: str
    intrinsics: Intrinsics


@dataclass(frozen=True)
class Recording:
    """What the writer records besides the frames: encoding, sensors, calibration, faults.

    ``cameras`` maps a camera name (``front``, ``rear``) to its sensor; a ``rear`` camera is
    written only when the frames carry rear images. ``clock_offsets_ns`` shifts a role's header
    stamps against log time: zero on a healthy car, set to inject a clock fault.
    """

    sensor_config_version: str
    image_encoding: str = "jpeg"
    jpeg_quality: int = 90
    cameras: Mapping[str, CameraSensor] = field(default_factory=dict)
    lidar_frame_id: str = "lidar"
    transforms: Sequence[StaticTransform] = ()
    clock_offsets_ns: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.image_encoding not in IMAGE_ENCODINGS:
            raise ValueError(
                f"image encoding must be one of {IMAGE_ENCODINGS}, got {self.image_encoding!r}"
            )
        if not 1 <= int(self.jpeg_quality) <= 95:
            raise ValueError(f"jpeg_quality must be in [1, 95], got {self.jpeg_quality}")
        unknown = set(self.clock_offsets_ns) - set(SKEWABLE_ROLES)
        if unknown:
            raise ValueError(f"clock offsets for unknown roles {sorted(unknown)}")

    def offset_ns(self, role: str) -> int:
        return int(self.clock_offsets_ns.get(role, 0))


def canonical_calibration(
    cameras: Mapping[str, Mapping[str, Any]], transforms: Sequence[Mapping[str, Any]]
) -> bytes:
    """The canonical byte form hashed for the scene index: sorted-key, compact JSON.

    ``cameras`` maps a calibration role to its width, height, K, D and distortion model;
    ``transforms`` are parent/child/translation/rotation records, sorted here so that the order
    a recorder wrote them in does not change the hash. Floats keep Python's shortest
    round-trip repr, so equal doubles always give equal bytes.
    """
    ordered = sorted(transforms, key=lambda t: (str(t["parent"]), str(t["child"])))
    body = {"cameras": dict(cameras), "transforms": ordered}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def calibration_sha256(
    cameras: Mapping[str, Mapping[str, Any]], transforms: Sequence[Mapping[str, Any]]
) -> str:
    """SHA-256 (hex) of :func:`canonical_calibration`; ``""`` when nothing was calibrated."""
    if not cameras and not transforms:
        return ""
    return hashlib.sha256(canonical_calibration(cameras, transforms)).hexdigest()
