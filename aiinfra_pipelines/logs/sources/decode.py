"""Decoding one role's MCAP messages, whatever the recorder: ROS 2 CDR, protobuf or JSON.

Each schema is decoded from the definition embedded in the file (``mcap-ros2-support`` for
``ros2msg``, ``mcap-protobuf-support`` for protobuf descriptor sets), so a profile needs no
generated code. What a role means is read field by field, tolerant of the ROS and Foxglove
spellings of the same thing (``k`` / ``K``, ``header.stamp`` / ``timestamp``); anything that
cannot form the value a frame needs raises :class:`DriveLogError` with a stable code.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
from mcap.records import Channel, Schema
from mcap.records import Message as McapMessage
from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoderFactory
from mcap_ros2.decoder import DecoderFactory as Ros2DecoderFactory
from PIL import Image, UnidentifiedImageError

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.limits import ReadLimits

# PointField datatypes (sensor_msgs/PointField, foxglove.PackedElementField differ: see below).
_ROS_FLOAT32 = 7
_FOXGLOVE_FLOAT32 = 7
_JPEG_MAGIC = b"\xff\xd8"


class MessageDecoder:
    """Decoded message objects for a file's channels, one decoder built per schema."""

    def __init__(self, schemas: dict[int, Schema]) -> None:
        self._schemas = schemas
        self._decoders: dict[int, Callable[[bytes], Any]] = {}
        self._ros2 = Ros2DecoderFactory()
        self._protobuf = ProtobufDecoderFactory()

    def _decoder(self, channel: Channel) -> Callable[[bytes], Any]:
        if channel.id not in self._decoders:
            encoding = channel.message_encoding
            if encoding == "json":
                self._decoders[channel.id] = lambda data: json.loads(data)
            else:
                schema = self._schemas.get(channel.schema_id)
                factory = self._ros2 if encoding == "cdr" else self._protobuf
                decoder = None if schema is None else factory.decoder_for(encoding, schema)
                if decoder is None:
                    raise DriveLogError(
                        errors.WRONG_SCHEMA,
                        f"{channel.topic}: cannot decode {encoding} without a usable schema",
                    )
                self._decoders[channel.id] = decoder
        return self._decoders[channel.id]

    def decode(self, channel: Channel, record: McapMessage) -> Any:
        try:
            return self._decoder(channel)(record.data)
        except DriveLogError:
            raise
        except Exception as exc:  # each codec raises its own types for a bad payload
            raise DriveLogError(
                errors.DECODE_ERROR,
                f"{channel.topic} message at {record.log_time} is not valid "
                f"{channel.message_encoding}: {type(exc).__name__}: {exc}",
            ) from exc


def _get(message: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the message has (attribute or JSON key)."""
    for name in names:
        if isinstance(message, dict):
            if name in message:
                return message[name]
        elif hasattr(message, name):
            return getattr(message, name)
    return default


def header_stamp_ns(message: Any) -> int | None:
    """The sensor's own stamp: ROS ``header.stamp`` (or a bare ``stamp``, as Autoware's
    ``SteeringReport`` has), Foxglove ``timestamp``, JSON ``stamp_ns``."""
    header = _get(message, "header")
    stamp = _get(header, "stamp") if header is not None else _get(message, "stamp")
    if stamp is not None and hasattr(stamp, "nanosec"):
        return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
    stamp = _get(message, "timestamp")
    if stamp is not None and hasattr(stamp, "seconds"):
        return int(stamp.seconds) * 1_000_000_000 + int(stamp.nanos)
    value = _get(message, "stamp_ns")
    return None if value is None else int(value)


def image_rgb(message: Any, where: str, limits: ReadLimits | None = None) -> np.ndarray:
    """An H x W x 3 uint8 image from a compressed (jpeg/png) or raw (rgb8/bgr8) camera message.

    The dimensions the message states (a compressed image's header, a raw image's fields) are
    checked against ``logs.yaml`` ``limits`` before any pixel is decoded (``image_too_large``);
    a JPEG the decoder reports as damaged (libjpeg-turbo's "corrupt data" warnings, which
    other decoders swallow and fill with grey) is ``bad_image``.
    """
    limits = limits or ReadLimits.load()
    data = bytes(_get(message, "data", default=b""))
    fmt = _get(message, "format")
    if fmt is not None:  # CompressedImage, ROS or Foxglove
        return _compressed_rgb(data, str(fmt), where, limits)
    height, width = int(_get(message, "height", default=0)), int(_get(message, "width", default=0))
    step, encoding = int(_get(message, "step", default=0)), str(_get(message, "encoding"))
    if encoding not in ("rgb8", "bgr8"):
        raise DriveLogError(errors.BAD_IMAGE, f"{where}: raw encoding {encoding!r} unsupported")
    limits.check_image(width, height, where)
    if height <= 0 or width <= 0 or step < width * 3 or len(data) < height * step:
        raise DriveLogError(
            errors.BAD_IMAGE, f"{where}: {len(data)} B cannot hold {height}x{width} {encoding}"
        )
    rows = np.frombuffer(data, dtype=np.uint8, count=height * step).reshape(height, step)
    image = rows[:, : width * 3].reshape(height, width, 3)
    return (image[..., ::-1] if encoding == "bgr8" else image).copy()


def _is_jpeg(data: bytes, fmt: str) -> bool:
    return data[:2] == _JPEG_MAGIC or "jpeg" in fmt.lower() or "jpg" in fmt.lower()


def _compressed_rgb(data: bytes, fmt: str, where: str, limits: ReadLimits) -> np.ndarray:
    if _is_jpeg(data, fmt):
        try:
            height, width, _colorspace, _subsampling = simplejpeg.decode_jpeg_header(data)
        except ValueError as exc:
            raise DriveLogError(
                errors.BAD_IMAGE, f"{where}: {fmt!r} image has no readable JPEG header: {exc}"
            ) from exc
        limits.check_image(width, height, where)
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
        except ValueError as exc:
            raise DriveLogError(
                errors.BAD_IMAGE, f"{where}: {fmt!r} image is damaged: {exc}"
            ) from exc
    try:
        with Image.open(io.BytesIO(data)) as decoded:  # reads the header only
            limits.check_image(decoded.width, decoded.height, where)
            decoded.load()
            return np.asarray(decoded.convert("RGB"), dtype=np.uint8).copy()
    except Image.DecompressionBombError as exc:  # Pillow's own cap, met before ours
        raise DriveLogError(errors.IMAGE_TOO_LARGE, f"{where}: {fmt!r} image: {exc}") from exc
    except UnidentifiedImageError as exc:
        raise DriveLogError(
            errors.BAD_IMAGE, f"{where}: {fmt!r} image is not in a format we read"
        ) from exc
    except (OSError, ValueError) as exc:
        raise DriveLogError(
            errors.BAD_IMAGE, f"{where}: {fmt!r} image does not decode: {exc}"
        ) from exc


@dataclass(frozen=True)
class Calibration:
    """A camera's intrinsics as recorded: image size and the 3 x 3 matrix K (row-major)."""

    width: int
    height: int
    k: tuple[float, ...]
    distortion_model: str
    d: tuple[float, ...] = ()

    def canonical(self) -> dict[str, Any]:
        """What the calibration hash covers (logs.rig.calibration_sha256)."""
        return {
            "width": self.width,
            "height": self.height,
            "k": list(self.k),
            "d": list(self.d),
            "distortion_model": self.distortion_model,
        }

    def problems(self, image_shape: tuple[int, ...] | None) -> list[str]:
        found = []
        if len(self.k) != 9 or not all(math.isfinite(v) for v in self.k):
            found.append(f"K must be 9 finite numbers, got {list(self.k)}")
        elif self.k[0] <= 0 or self.k[4] <= 0:
            found.append(f"focal lengths must be positive, got fx={self.k[0]} fy={self.k[4]}")
        if image_shape is not None and (self.height, self.width) != tuple(image_shape[:2]):
            found.append(
                f"calibrated for {self.width}x{self.height}, images are "
                f"{image_shape[1]}x{image_shape[0]}"
            )
        return found


def calibration(message: Any) -> Calibration:
    """Intrinsics from ``sensor_msgs/CameraInfo`` or ``foxglove.CameraCalibration``."""
    return Calibration(
        width=int(_get(message, "width", default=0)),
        height=int(_get(message, "height", default=0)),
        k=tuple(float(v) for v in _get(message, "k", "K", default=())),
        distortion_model=str(_get(message, "distortion_model", default="")),
        d=tuple(float(v) for v in _get(message, "d", "D", default=())),
    )


def _xyz(vector: Any, axes: str) -> list[float]:
    return [float(getattr(vector, axis)) for axis in axes]


def static_transforms(message: Any) -> list[dict[str, Any]]:
    """Parent, child, translation and rotation of ``TFMessage`` / ``foxglove.FrameTransforms``."""
    found = []
    for entry in _get(message, "transforms", default=[]):
        if hasattr(entry, "transform"):  # geometry_msgs/TransformStamped
            parent, moved = entry.header.frame_id, entry.transform
        else:  # foxglove.FrameTransform
            parent, moved = entry.parent_frame_id, entry
        found.append(
            {
                "parent": str(parent),
                "child": str(entry.child_frame_id),
                "translation": _xyz(moved.translation, "xyz"),
                "rotation": _xyz(moved.rotation, "xyzw"),
            }
        )
    return found


def point_count(message: Any, where: str) -> int:
    """Points in a ``PointCloud2`` / ``foxglove.PointCloud``, after checking its field layout.

    x, y and z must be FLOAT32 fields inside the point stride, and the data must hold exactly
    the announced points: a cloud that fails either cannot be read as positions.
    """
    fields = {str(_get(f, "name")): f for f in _get(message, "fields", default=[])}
    stride = int(_get(message, "point_step", "point_stride", default=0))
    data = bytes(_get(message, "data", default=b""))
    problems = []
    for axis in ("x", "y", "z"):
        field = fields.get(axis)
        if field is None:
            problems.append(f"no {axis} field")
            continue
        kind = int(_get(field, "datatype", "type", default=0))
        offset = int(_get(field, "offset", default=-1))
        if kind not in (_ROS_FLOAT32, _FOXGLOVE_FLOAT32):
            problems.append(f"{axis} is datatype {kind}, not FLOAT32")
        if offset < 0 or offset + 4 > stride:
            problems.append(f"{axis} at offset {offset} outside the {stride} B point")
    if stride <= 0:
        problems.append(f"point stride {stride}")
    if problems:
        raise DriveLogError(errors.BAD_POINT_CLOUD, f"{where}: {'; '.join(problems)}")
    width, height = _get(message, "width"), _get(message, "height")
    if width is not None and height is not None:  # PointCloud2 announces its size
        expected = int(width) * int(height) * stride
        if len(data) != expected:
            raise DriveLogError(
                errors.BAD_POINT_CLOUD,
                f"{where}: {len(data)} B of data for {width}x{height} points of {stride} B",
            )
        return int(width) * int(height)
    if len(data) % stride:
        raise DriveLogError(
            errors.BAD_POINT_CLOUD, f"{where}: {len(data)} B is not a whole number of points"
        )
    return len(data) // stride


def points_xyz(message: Any, where: str) -> np.ndarray:
    """The cloud's positions as N x 3 float32 (layout checked by :func:`point_count`)."""
    count = point_count(message, where)
    stride = int(_get(message, "point_step", "point_stride", default=0))
    fields = {str(_get(f, "name")): f for f in _get(message, "fields", default=[])}
    data = np.frombuffer(bytes(_get(message, "data", default=b"")), dtype=np.uint8)
    rows = data[: count * stride].reshape(count, stride)
    offsets = [int(_get(fields[axis], "offset")) for axis in ("x", "y", "z")]
    if offsets == [0, 4, 8]:  # packed x, y, z first: one view, no per-axis copies
        return rows[:, :12].copy().view("<f4").reshape(count, 3)
    columns = [rows[:, o : o + 4].copy().view("<f4").reshape(count) for o in offsets]
    return np.stack(columns, axis=1)


def position_fix(message: Any) -> tuple[float, float]:
    """(latitude, longitude) from ``NavSatFix`` or ``foxglove.LocationFix``."""
    return float(message.latitude), float(message.longitude)


def pose_xy_heading(message: Any) -> tuple[float, float, float]:
    """(x, y, yaw) from ``nav_msgs/Odometry`` or ``foxglove.PoseInFrame``."""
    pose = message.pose.pose if hasattr(message.pose, "pose") else message.pose
    q = pose.orientation
    yaw = math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))
    return float(pose.position.x), float(pose.position.y), yaw
