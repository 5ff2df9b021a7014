"""The second layer of reading an MCAP drive log: checking each known topic's schema and
decoding protobuf messages into the frames, trigger events and degradation transitions of a
:class:`~aiinfra_pipelines.logs.model.DriveLog`.

Every decoding failure is a :class:`DriveLogError` with a stable reason code; :mod:`.reader`
decides which records to decode and how they align in time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError, Message
from mcap.records import Channel, Schema
from mcap.records import Message as McapMessage
from mcap.well_known import MessageEncoding, SchemaEncoding

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.message_encode import IMAGE_ENCODING
from aiinfra_pipelines.logs.model import (
    TOPIC_DEGRADATION,
    TOPIC_LIDAR,
    TOPIC_TRIGGERS,
    DegradationEvent,
    Frame,
    OtherVehicle,
    TriggerEvent,
)
from aiinfra_pipelines.logs.schemas import TOPIC_SCHEMAS, accepted_schemas, message_class
from aiinfra_pipelines.logs.sources import decode as role_decode


def _check_schema(topic: str, channel: Channel, schema: Schema | None) -> None:
    accepted = accepted_schemas(topic)
    expected = " or ".join(accepted)
    if (
        schema is None
        or schema.name not in accepted
        or schema.encoding != SchemaEncoding.Protobuf
        or channel.message_encoding != MessageEncoding.Protobuf
    ):
        found = "no schema" if schema is None else f"{schema.name} ({schema.encoding})"
        raise DriveLogError(
            errors.WRONG_SCHEMA, f"{topic} must carry protobuf {expected}, found {found}"
        )


def check_schemas(channels: dict[int, Channel], schemas: dict[int, Schema]) -> list[DriveLogError]:
    """One error per known topic whose schema or encoding is not the one we write."""
    problems = []
    for channel in channels.values():
        if channel.topic not in TOPIC_SCHEMAS:
            continue  # extra channels (e.g. a second camera) are allowed and ignored
        try:
            _check_schema(channel.topic, channel, schemas.get(channel.schema_id))
        except DriveLogError as exc:
            problems.append(exc)
    return problems


def decode_message(topic: str, record: McapMessage, schema_name: str | None = None) -> Message:
    try:
        return message_class(topic, schema_name).FromString(record.data)
    except DecodeError as exc:
        raise DriveLogError(
            errors.DECODE_ERROR, f"{topic} message at {record.log_time} is not valid: {exc}"
        ) from exc


def decode_image(message: Any, timestamp_ns: int) -> np.ndarray:
    if message.DESCRIPTOR.name == "CompressedImage":  # fleet-7: JPEG, decoded to rgb8 here
        return role_decode.image_rgb(message, f"frame {timestamp_ns}")
    height, width, step = int(message.height), int(message.width), int(message.step)
    row_bytes = width * 3
    if message.encoding != IMAGE_ENCODING:
        raise DriveLogError(
            errors.BAD_IMAGE, f"frame {timestamp_ns}: encoding {message.encoding!r} is not rgb8"
        )
    if height == 0 or width == 0:
        return np.zeros((height, width, 3), dtype=np.uint8)
    if step < row_bytes or len(message.data) < height * step:
        raise DriveLogError(
            errors.BAD_IMAGE,
            f"frame {timestamp_ns}: {len(message.data)} B cannot hold {height}x{width} rgb8 "
            f"with step {step}",
        )
    rows = np.frombuffer(message.data, dtype=np.uint8, count=height * step).reshape(height, step)
    return rows[:, :row_bytes].reshape(height, width, 3).copy()


def quaternion_to_heading(x: float, y: float, z: float, w: float) -> float:
    """Yaw of a quaternion in (-pi, pi]; the inverse of the writer's heading encoding."""
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def _others(ground_truth: Any | None) -> list[OtherVehicle]:
    if ground_truth is None:
        return []
    return [
        OtherVehicle(
            vehicle_id=v.vehicle_id,
            x=v.x,
            y=v.y,
            vx=v.vx,
            vy=v.vy,
            lane_offset=v.lane_offset,
            plate_box=(v.plate_x0, v.plate_y0, v.plate_x1, v.plate_y1) if v.has_plate else None,
            rear_plate_box=(v.rear_plate_x0, v.rear_plate_y0, v.rear_plate_x1, v.rear_plate_y1)
            if v.has_rear_plate
            else None,
        )
        for v in ground_truth.vehicles
    ]


def frame_signals(
    timestamp_ns: int,
    location: Any,
    pose: Any,
    can: Any,
    ground_truth: Any | None,
    image: np.ndarray,
) -> Frame:
    """A frame's signals and ground truth around an already decoded (or placeholder) image."""
    orientation = pose.pose.orientation
    return Frame(
        timestamp_ns=timestamp_ns,
        image=image,
        latitude=location.latitude,
        longitude=location.longitude,
        x=pose.pose.position.x,
        y=pose.pose.position.y,
        heading=quaternion_to_heading(orientation.x, orientation.y, orientation.z, orientation.w),
        speed_mps=can.speed_mps,
        accel_mps2=can.accel_mps2,
        steering_rad=can.steering_rad,
        brake=can.brake,
        lane_index=ground_truth.lane_index if ground_truth is not None else 0,
        lane_count=ground_truth.lane_count if ground_truth is not None else 0,
        others=_others(ground_truth),
    )


def frame_payloads(
    timestamp_ns: int, camera: Any, rear_camera: Any | None = None, lidar: Any | None = None
) -> dict[str, Any]:
    """A frame's sensor payloads decoded: ``image``, ``rear_image`` and ``lidar_points``."""
    return {
        "image": decode_image(camera, timestamp_ns),
        "rear_image": None if rear_camera is None else decode_image(rear_camera, timestamp_ns),
        "lidar_points": None
        if lidar is None
        else role_decode.points_xyz(lidar, f"{TOPIC_LIDAR} at {timestamp_ns}"),
    }


def frame_from_messages(
    timestamp_ns: int,
    camera: Any,
    location: Any,
    pose: Any,
    can: Any,
    ground_truth: Any | None,
    rear_camera: Any | None = None,
    lidar: Any | None = None,
) -> Frame:
    payloads = frame_payloads(timestamp_ns, camera, rear_camera, lidar)
    frame = frame_signals(timestamp_ns, location, pose, can, ground_truth, payloads.pop("image"))
    return dataclasses.replace(frame, **payloads)


def trigger_event(record: McapMessage) -> TriggerEvent:
    message: Any = decode_message(TOPIC_TRIGGERS, record)
    return TriggerEvent(
        timestamp_ns=record.log_time,
        rule=message.rule,
        value=message.value,
        threshold=message.threshold,
    )


def degradation_event(record: McapMessage) -> DegradationEvent:
    message: Any = decode_message(TOPIC_DEGRADATION, record)
    return DegradationEvent(
        timestamp_ns=record.log_time,
        from_state=message.from_state,
        to_state=message.to_state,
        cause=message.cause,
        detail=message.detail,
    )
