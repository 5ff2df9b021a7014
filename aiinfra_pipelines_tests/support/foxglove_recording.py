"""A car recorded with Foxglove's protobuf schemas, written with the stock MCAP writers.

Protobuf channels are registered by ``mcap-protobuf-support``'s own ``register_schema`` (the
FileDescriptorSet Foxglove reads) on a plain ``mcap`` writer, so the JSON vehicle-status and
event channels and the ``drive_log`` metadata record can share the file.
"""

from __future__ import annotations

import io
import math

from foxglove_schemas_protobuf.CameraCalibration_pb2 import CameraCalibration
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from foxglove_schemas_protobuf.FrameTransforms_pb2 import FrameTransforms
from foxglove_schemas_protobuf.LocationFix_pb2 import LocationFix
from foxglove_schemas_protobuf.PackedElementField_pb2 import PackedElementField
from foxglove_schemas_protobuf.PointCloud_pb2 import PointCloud
from foxglove_schemas_protobuf.PoseInFrame_pb2 import PoseInFrame
from google.protobuf.timestamp_pb2 import Timestamp
from mcap.writer import Writer
from mcap_protobuf.schema import register_schema

from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines_tests.support.ros2_recording import (
    HEIGHT,
    START_NS,
    WIDTH,
    JsonChannels,
    _jpeg,
)


def _stamp(time_ns: int) -> Timestamp:
    return Timestamp(seconds=time_ns // 1_000_000_000, nanos=time_ns % 1_000_000_000)


def write_foxglove_recording(n_frames: int = 20) -> bytes:
    """10 Hz JPEG camera with calibration, 5 Hz GNSS and point clouds, pose, JSON status."""
    log = make_synthetic_log(n_frames, image_height=HEIGHT, image_width=WIDTH, plates_per_frame=0)
    buffer = io.BytesIO()
    writer = Writer(buffer)
    writer.start(profile="", library="test-foxglove-recorder")
    channels: dict[str, int] = {}

    def write(topic: str, message, time_ns: int) -> None:
        if topic not in channels:
            schema = register_schema(writer, type(message))
            channels[topic] = writer.register_channel(topic, "protobuf", schema)
        writer.add_message(channels[topic], time_ns, message.SerializeToString(), time_ns)

    json_channels = JsonChannels(writer)

    write("/tf_static", FrameTransforms(), START_NS)
    for i, frame in enumerate(log.frames):
        t = START_NS + i * 100_000_000
        write(
            "/camera/front/compressed",
            CompressedImage(
                timestamp=_stamp(t),
                frame_id="camera_front",
                format="jpeg",
                data=_jpeg(frame.image),
            ),
            t,
        )
        if i % 10 == 0:
            write(
                "/camera/front/calibration",
                CameraCalibration(
                    timestamp=_stamp(t),
                    frame_id="camera_front",
                    width=WIDTH,
                    height=HEIGHT,
                    distortion_model="plumb_bob",
                    D=[0.0] * 5,
                    K=[100.0, 0.0, WIDTH / 2, 0.0, 100.0, HEIGHT / 2, 0.0, 0.0, 1.0],
                ),
                t,
            )
        if i % 2 == 0:
            write(
                "/gnss/fix",
                LocationFix(
                    timestamp=_stamp(t), latitude=frame.latitude, longitude=frame.longitude
                ),
                t,
            )
            write(
                "/lidar/points",
                PointCloud(
                    timestamp=_stamp(t),
                    frame_id="lidar",
                    point_stride=12,
                    fields=[
                        PackedElementField(name=axis, offset=4 * k, type=7)
                        for k, axis in enumerate("xyz")
                    ],
                    data=bytes(12 * 32),
                ),
                t,
            )
        pose = PoseInFrame(timestamp=_stamp(t), frame_id="map")
        pose.pose.position.x, pose.pose.position.y = frame.x, frame.y
        pose.pose.orientation.z = math.sin(frame.heading / 2.0)
        pose.pose.orientation.w = math.cos(frame.heading / 2.0)
        write("/pose", pose, t)
        json_channels.vehicle_status(frame, t)
    json_channels.events(log)
    writer.add_metadata("drive_log", dict(log.metadata))
    writer.finish()
    return buffer.getvalue()
