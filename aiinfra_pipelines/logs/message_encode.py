"""One Foxglove / project protobuf message per drive-log record: images, poses, CAN, rig.

The writer decides *which* messages go into a file and in what order; this module only turns
one frame, event or sensor description into one message. It stands apart because the
message layouts (frame ids, image encodings, stamps shifted by injected clock faults) are the
contract the reader and Foxglove decode, and benchmarks reuse the image encoders on their own.
"""

from __future__ import annotations

import io
import math

import numpy as np
from foxglove_schemas_protobuf.CameraCalibration_pb2 import CameraCalibration
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.FrameTransforms_pb2 import FrameTransforms
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from foxglove_schemas_protobuf.PackedElementField_pb2 import PackedElementField
from foxglove_schemas_protobuf.PointCloud_pb2 import PointCloud
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf.message import Message
from PIL import Image

from aiinfra_pipelines.logs.model import DegradationEvent, Frame
from aiinfra_pipelines.logs.model import TriggerEvent as TriggerEventRecord
from aiinfra_pipelines.logs.rig import CameraSensor, Recording
from aiinfra_pipelines.logs.schemas import (
    CanSignals,
    DegradationTransition,
    GroundTruth,
    TriggerEvent,
)

CAMERA_FRAME_ID = "camera_front"
GPS_FRAME_ID = "gps"
MAP_FRAME_ID = "map"
IMAGE_ENCODING = "rgb8"


def heading_to_quaternion(heading: float) -> tuple[float, float, float, float]:
    """Yaw about +z as ``(x, y, z, w)``; the reader inverts it, wrapping into (-pi, pi]."""
    return (0.0, 0.0, math.sin(heading / 2.0), math.cos(heading / 2.0))


def _check_image(image: np.ndarray, timestamp_ns: int) -> None:
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"frame {timestamp_ns}: image must be HxWx3 uint8 (rgb8), "
            f"got shape {image.shape} dtype {image.dtype}"
        )


def raw_image_message(image: np.ndarray, frame_id: str, stamp_ns: int) -> RawImage:
    """``foxglove.RawImage`` rgb8, the pre-rig layout and the ``camera.encoding: raw`` knob."""
    _check_image(image, stamp_ns)
    height, width = int(image.shape[0]), int(image.shape[1])
    message = RawImage(
        frame_id=frame_id,
        width=width,
        height=height,
        encoding=IMAGE_ENCODING,
        step=width * 3,
        data=np.ascontiguousarray(image).tobytes(),
    )
    message.timestamp.FromNanoseconds(stamp_ns)
    return message


def jpeg_bytes(image: np.ndarray, quality: int) -> bytes:
    """Baseline JPEG of an rgb8 image, as a car's camera pipeline would compress it."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image), mode="RGB").save(
        buffer, format="JPEG", quality=int(quality)
    )
    return buffer.getvalue()


def compressed_image_message(
    image: np.ndarray, frame_id: str, stamp_ns: int, quality: int
) -> CompressedImage:
    """``foxglove.CompressedImage`` (format ``jpeg``), what a real car's camera records."""
    _check_image(image, stamp_ns)
    message = CompressedImage(frame_id=frame_id, format="jpeg", data=jpeg_bytes(image, quality))
    message.timestamp.FromNanoseconds(stamp_ns)
    return message


def _image_message(
    image: np.ndarray, frame_id: str, stamp_ns: int, recording: Recording | None
) -> Message:
    if recording is not None and recording.image_encoding == "jpeg":
        return compressed_image_message(image, frame_id, stamp_ns, recording.jpeg_quality)
    return raw_image_message(image, frame_id, stamp_ns)


def camera_message(frame: Frame, recording: Recording | None = None) -> Message:
    stamp = frame.timestamp_ns + (recording.offset_ns("front_camera") if recording else 0)
    return _image_message(frame.image, CAMERA_FRAME_ID, stamp, recording)


def _stamp(frame: Frame, recording: Recording | None, role: str) -> int:
    """The sensor's own header stamp: the frame time, shifted where a clock fault is injected."""
    return frame.timestamp_ns + (recording.offset_ns(role) if recording is not None else 0)


def location_message(frame: Frame, recording: Recording | None = None) -> LocationFix:
    message = LocationFix(frame_id=GPS_FRAME_ID, latitude=frame.latitude, longitude=frame.longitude)
    message.timestamp.FromNanoseconds(_stamp(frame, recording, "gnss"))
    return message


def pose_message(frame: Frame, recording: Recording | None = None) -> PoseInFrame:
    message = PoseInFrame(frame_id=MAP_FRAME_ID)
    message.timestamp.FromNanoseconds(_stamp(frame, recording, "pose"))
    message.pose.position.x = frame.x
    message.pose.position.y = frame.y
    qx, qy, qz, qw = heading_to_quaternion(frame.heading)
    orientation = message.pose.orientation
    orientation.x, orientation.y, orientation.z, orientation.w = qx, qy, qz, qw
    return message


def can_message(frame: Frame, recording: Recording | None = None) -> Message:
    message = CanSignals(
        speed_mps=frame.speed_mps,
        accel_mps2=frame.accel_mps2,
        steering_rad=frame.steering_rad,
        brake=frame.brake,
    )
    message.timestamp.FromNanoseconds(_stamp(frame, recording, "vehicle_status"))
    return message


def ground_truth_message(frame: Frame, recording: Recording | None = None) -> Message:
    message = GroundTruth(lane_index=frame.lane_index, lane_count=frame.lane_count)
    message.timestamp.FromNanoseconds(frame.timestamp_ns)
    for other in frame.others:
        vehicle = message.vehicles.add(
            vehicle_id=other.vehicle_id,
            x=other.x,
            y=other.y,
            vx=other.vx,
            vy=other.vy,
            lane_offset=other.lane_offset,
            has_plate=other.plate_box is not None,
        )
        if other.plate_box is not None:
            x0, y0, x1, y1 = other.plate_box
            vehicle.plate_x0, vehicle.plate_y0, vehicle.plate_x1, vehicle.plate_y1 = (
                x0,
                y0,
                x1,
                y1,
            )
        if other.rear_plate_box is not None:
            vehicle.has_rear_plate = True
            x0, y0, x1, y1 = other.rear_plate_box
            vehicle.rear_plate_x0, vehicle.rear_plate_y0 = x0, y0
            vehicle.rear_plate_x1, vehicle.rear_plate_y1 = x1, y1
    return message


_XYZ_FIELDS = tuple(
    PackedElementField(name=axis, offset=4 * i, type=PackedElementField.FLOAT32)
    for i, axis in enumerate("xyz")
)


def rear_camera_message(frame: Frame, recording: Recording) -> Message:
    camera = recording.cameras["rear"]
    stamp = _stamp(frame, recording, "rear_camera")
    return _image_message(frame.rear_image, camera.frame_id, stamp, recording)


def lidar_message(frame: Frame, recording: Recording) -> PointCloud:
    """``foxglove.PointCloud``: x, y, z FLOAT32 packed per point, in the lidar's frame."""
    points = np.ascontiguousarray(frame.lidar_points, dtype="<f4").reshape(-1, 3)
    message = PointCloud(
        frame_id=recording.lidar_frame_id,
        point_stride=12,
        fields=_XYZ_FIELDS,
        data=points.tobytes(),
    )
    message.pose.orientation.w = 1.0
    message.timestamp.FromNanoseconds(_stamp(frame, recording, "lidar"))
    return message


def calibration_message(camera: CameraSensor, stamp_ns: int) -> CameraCalibration:
    intrinsics = camera.intrinsics
    message = CameraCalibration(
        frame_id=camera.frame_id,
        width=intrinsics.width,
        height=intrinsics.height,
        distortion_model=intrinsics.distortion_model,
        D=list(intrinsics.d),
        K=list(intrinsics.k),
        R=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        P=list(intrinsics.p),
    )
    message.timestamp.FromNanoseconds(stamp_ns)
    return message


def transforms_message(recording: Recording, stamp_ns: int) -> FrameTransforms:
    message = FrameTransforms()
    for transform in recording.transforms:
        entry = message.transforms.add(
            parent_frame_id=transform.parent, child_frame_id=transform.child
        )
        entry.timestamp.FromNanoseconds(stamp_ns)
        entry.translation.x, entry.translation.y, entry.translation.z = transform.translation
        rotation = entry.rotation
        rotation.x, rotation.y, rotation.z, rotation.w = transform.rotation
    return message


def event_message(event: TriggerEventRecord) -> Message:
    message = TriggerEvent(rule=event.rule, value=event.value, threshold=event.threshold)
    message.timestamp.FromNanoseconds(event.timestamp_ns)
    return message


def degradation_message(event: DegradationEvent) -> Message:
    message = DegradationTransition(
        from_state=event.from_state, to_state=event.to_state, cause=event.cause, detail=event.detail
    )
    message.timestamp.FromNanoseconds(event.timestamp_ns)
    return message
