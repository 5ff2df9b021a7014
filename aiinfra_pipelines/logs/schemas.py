"""Protobuf message classes for the channels Foxglove has no schema for (CAN, triggers, truth).

The classes are built from a ``FileDescriptorProto`` at import time instead of from generated
``_pb2`` code, so the project needs no ``protoc`` step and the schema lives next to the codec
that uses it. They are registered in the *default* descriptor pool on purpose:
``mcap_protobuf.writer.Writer`` embeds each channel's schema by walking
``DESCRIPTOR.file`` and its dependencies, and ``google/protobuf/timestamp.proto`` must resolve
to the same file the foxglove schemas depend on, otherwise Foxglove Studio would receive two
different definitions of ``google.protobuf.Timestamp`` in one recording.
"""

from __future__ import annotations

from foxglove_schemas_protobuf.CameraCalibration_pb2 import CameraCalibration
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.FrameTransforms_pb2 import FrameTransforms
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from foxglove_schemas_protobuf.PointCloud_pb2 import PointCloud
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from foxglove_schemas_protobuf.RawImage_pb2 import RawImage
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf import timestamp_pb2 as _timestamp_pb2  # registers the dependency
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import Message

from aiinfra_pipelines.logs.model import (
    TOPIC_CAMERA,
    TOPIC_CAMERA_CALIBRATION,
    TOPIC_CAN,
    TOPIC_DEGRADATION,
    TOPIC_GROUND_TRUTH,
    TOPIC_LIDAR,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_REAR_CAMERA,
    TOPIC_REAR_CAMERA_CALIBRATION,
    TOPIC_TF_STATIC,
    TOPIC_TRIGGERS,
)

PROTO_PACKAGE = "aiinfra"
PROTO_FILE = "aiinfra/drive.proto"
_TIMESTAMP_FILE = _timestamp_pb2.DESCRIPTOR.name  # "google/protobuf/timestamp.proto"

_F = descriptor_pb2.FieldDescriptorProto
# (field name, protobuf scalar type or message type name, repeated?)
_FieldSpec = tuple[str, int | str, bool]

_MESSAGES: dict[str, list[_FieldSpec]] = {
    "CanSignals": [
        ("timestamp", ".google.protobuf.Timestamp", False),
        ("speed_mps", _F.TYPE_DOUBLE, False),
        ("accel_mps2", _F.TYPE_DOUBLE, False),
        ("steering_rad", _F.TYPE_DOUBLE, False),
        ("brake", _F.TYPE_DOUBLE, False),
    ],
    "TriggerEvent": [
        ("timestamp", ".google.protobuf.Timestamp", False),
        ("rule", _F.TYPE_STRING, False),
        ("value", _F.TYPE_DOUBLE, False),
        ("threshold", _F.TYPE_DOUBLE, False),
    ],
    "GroundTruthVehicle": [
        ("vehicle_id", _F.TYPE_INT32, False),
        ("x", _F.TYPE_DOUBLE, False),
        ("y", _F.TYPE_DOUBLE, False),
        ("vx", _F.TYPE_DOUBLE, False),
        ("vy", _F.TYPE_DOUBLE, False),
        ("lane_offset", _F.TYPE_INT32, False),
        ("has_plate", _F.TYPE_BOOL, False),
        ("plate_x0", _F.TYPE_INT32, False),
        ("plate_y0", _F.TYPE_INT32, False),
        ("plate_x1", _F.TYPE_INT32, False),
        ("plate_y1", _F.TYPE_INT32, False),
        # The plate in the rear camera's image (fields appended: older logs still decode).
        ("has_rear_plate", _F.TYPE_BOOL, False),
        ("rear_plate_x0", _F.TYPE_INT32, False),
        ("rear_plate_y0", _F.TYPE_INT32, False),
        ("rear_plate_x1", _F.TYPE_INT32, False),
        ("rear_plate_y1", _F.TYPE_INT32, False),
    ],
    "GroundTruth": [
        ("timestamp", ".google.protobuf.Timestamp", False),
        ("lane_index", _F.TYPE_INT32, False),
        ("lane_count", _F.TYPE_INT32, False),
        ("vehicles", f".{PROTO_PACKAGE}.GroundTruthVehicle", True),
    ],
    # A degradation state machine transition (vehicle.degradation); a message of its own
    # (added after the others), so logs without it decode as before.
    "DegradationTransition": [
        ("timestamp", ".google.protobuf.Timestamp", False),
        ("from_state", _F.TYPE_STRING, False),
        ("to_state", _F.TYPE_STRING, False),
        ("cause", _F.TYPE_STRING, False),
        ("detail", _F.TYPE_STRING, False),
    ],
}


def _add_field(message: descriptor_pb2.DescriptorProto, number: int, spec: _FieldSpec) -> None:
    name, kind, repeated = spec
    field = message.field.add(name=name, number=number, json_name=_json_name(name))
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if isinstance(kind, str):
        field.type = _F.TYPE_MESSAGE
        field.type_name = kind
    else:
        field.type = kind  # type: ignore[assignment]


def _json_name(name: str) -> str:
    # protoc fills json_name; Foxglove uses it to label fields in its panels.
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def build_file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The ``aiinfra/drive.proto`` definition, exactly what ``protoc`` would have produced."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name=PROTO_FILE, package=PROTO_PACKAGE, syntax="proto3"
    )
    file_proto.dependency.append(_TIMESTAMP_FILE)
    for message_name, fields in _MESSAGES.items():
        message = file_proto.message_type.add(name=message_name)
        for number, spec in enumerate(fields, start=1):
            _add_field(message, number, spec)
    return file_proto


def _register() -> FileDescriptor:
    """Add the file to the default pool once; re-imports (e.g. pytest reloads) reuse it."""
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(PROTO_FILE)
    except KeyError:
        pool.Add(build_file_descriptor_proto())
        return pool.FindFileByName(PROTO_FILE)


FILE_DESCRIPTOR: FileDescriptor = _register()


def _message_class(name: str) -> type[Message]:
    descriptor: Descriptor = FILE_DESCRIPTOR.message_types_by_name[name]
    return message_factory.GetMessageClass(descriptor)


CanSignals = _message_class("CanSignals")
TriggerEvent = _message_class("TriggerEvent")
GroundTruthVehicle = _message_class("GroundTruthVehicle")
GroundTruth = _message_class("GroundTruth")
DegradationTransition = _message_class("DegradationTransition")

# The schema each topic must carry. The reader rejects a known topic with another schema rather
# than guessing, because a silently mis-decoded CAN channel would poison every downstream label.
TOPIC_MESSAGE_CLASSES: dict[str, type[Message]] = {
    TOPIC_CAMERA: RawImage,
    TOPIC_LOCATION: LocationFix,
    TOPIC_POSE: PoseInFrame,
    TOPIC_CAN: CanSignals,
    TOPIC_TRIGGERS: TriggerEvent,
    TOPIC_GROUND_TRUTH: GroundTruth,
    TOPIC_DEGRADATION: DegradationTransition,
    TOPIC_CAMERA_CALIBRATION: CameraCalibration,
    TOPIC_REAR_CAMERA: RawImage,
    TOPIC_REAR_CAMERA_CALIBRATION: CameraCalibration,
    TOPIC_LIDAR: PointCloud,
    TOPIC_TF_STATIC: FrameTransforms,
}
TOPIC_SCHEMAS: dict[str, str] = {
    topic: cls.DESCRIPTOR.full_name for topic, cls in TOPIC_MESSAGE_CLASSES.items()
}
# Camera topics carry raw or JPEG images (fleet.yaml ``camera.encoding``): either schema is ours.
IMAGE_TOPICS: tuple[str, ...] = (TOPIC_CAMERA, TOPIC_REAR_CAMERA)
IMAGE_MESSAGE_CLASSES: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls for cls in (RawImage, CompressedImage)
}


def accepted_schemas(topic: str) -> tuple[str, ...]:
    """The schema names a known topic may carry (two for cameras, one for every other)."""
    if topic in IMAGE_TOPICS:
        return tuple(IMAGE_MESSAGE_CLASSES)
    return (TOPIC_SCHEMAS[topic],)


def message_class(topic: str, schema_name: str | None = None) -> type[Message]:
    """The class that decodes ``topic``; for a camera, the one its channel's schema names."""
    if topic in IMAGE_TOPICS and schema_name in IMAGE_MESSAGE_CLASSES:
        return IMAGE_MESSAGE_CLASSES[str(schema_name)]
    return TOPIC_MESSAGE_CLASSES[topic]


__all__ = [
    "FILE_DESCRIPTOR",
    "IMAGE_TOPICS",
    "PROTO_FILE",
    "PROTO_PACKAGE",
    "TOPIC_MESSAGE_CLASSES",
    "TOPIC_SCHEMAS",
    "CanSignals",
    "DegradationTransition",
    "GroundTruth",
    "GroundTruthVehicle",
    "TriggerEvent",
    "accepted_schemas",
    "build_file_descriptor_proto",
    "message_class",
]
