"""A ROS 2 car's recording, written with the stock MCAP writers (never the project's writer).

CDR payloads come from ``mcap-ros2-support``'s serializer for the stock ROS 2 message
definitions; the channels are registered exactly as ``mcap_ros2.writer.Writer`` registers them
(``cdr`` messages, ``ros2msg`` schemas). The JSON vehicle-status and event channels and the
``drive_log`` metadata record are plain ``mcap`` records. Fault knobs make one thing wrong.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from mcap.writer import Writer
from mcap_ros2.writer import serialize_dynamic
from PIL import Image

from aiinfra_pipelines.logs.sources.ros2_msgdefs import ros2_msgdef
from aiinfra_pipelines.logs.synthetic import make_synthetic_log

WIDTH, HEIGHT = 128, 48
STATUS_KEYS = ("speed_mps", "accel_mps2", "steering_rad", "brake")
START_NS = 1_717_228_800_000_000_000  # 2024-06-01T08:00:00Z


def _jpeg(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _header(time_ns: int, frame_id: str) -> dict[str, Any]:
    return {
        "stamp": {"sec": time_ns // 1_000_000_000, "nanosec": time_ns % 1_000_000_000},
        "frame_id": frame_id,
    }


def camera_info(time_ns: int, width: int = WIDTH) -> dict[str, Any]:
    """``sensor_msgs/msg/CameraInfo`` of the front camera (``width`` may lie, for tests)."""
    return {
        "header": _header(time_ns, "camera_front"),
        "height": HEIGHT,
        "width": width,
        "distortion_model": "plumb_bob",
        "d": [0.0] * 5,
        "k": [100.0, 0.0, WIDTH / 2, 0.0, 100.0, HEIGHT / 2, 0.0, 0.0, 1.0],
        "r": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        "p": [
            *(100.0, 0.0, WIDTH / 2, 0.0),
            *(0.0, 100.0, HEIGHT / 2, 0.0),
            *(0.0, 0.0, 1.0, 0.0),
        ],
    }


class JsonChannels:
    """The JSON channels both test recorders share: vehicle status and trigger events."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._channels: dict[str, int] = {}

    def write(self, topic: str, name: str, payload: dict[str, Any], time_ns: int) -> None:
        if topic not in self._channels:
            schema = self._writer.register_schema(name, "jsonschema", b'{"type": "object"}')
            self._channels[topic] = self._writer.register_channel(topic, "json", schema)
        data = json.dumps(payload).encode()
        self._writer.add_message(self._channels[topic], time_ns, data, time_ns)

    def vehicle_status(
        self,
        frame: Any,
        time_ns: int,
        schema: str = "aiinfra.VehicleStatus",
        keys: tuple[str, ...] = STATUS_KEYS,
    ) -> None:
        payload = {key: getattr(frame, key) for key in keys}
        self.write("/vehicle/status", schema, payload, time_ns)

    def events(self, log: Any) -> None:
        """The log's trigger events, on the recording's clock (starting at START_NS)."""
        for event in log.events:
            self.write(
                "/events",
                "aiinfra.TriggerEvent",
                {"rule": event.rule, "value": event.value, "threshold": event.threshold},
                START_NS + (event.timestamp_ns - log.frames[0].timestamp_ns),
            )


def _cloud(time_ns: int, points: int, wrong_layout: bool) -> dict[str, Any]:
    xyz = np.random.default_rng(points).normal(size=(points, 4)).astype(np.float32)
    kind = 8 if wrong_layout else 7  # FLOAT64 announced over FLOAT32 bytes
    return {
        "header": _header(time_ns, "lidar"),
        "height": 1,
        "width": points,
        "fields": [
            {"name": name, "offset": 4 * i, "datatype": kind, "count": 1}
            for i, name in enumerate(("x", "y", "z", "intensity"))
        ],
        "is_bigendian": False,
        "point_step": 16,
        "row_step": 16 * points,
        "data": xyz.tobytes(),
        "is_dense": True,
    }


def write_ros2_recording(
    n_frames: int = 20,
    *,
    calibration: bool = True,
    calibration_width: int = WIDTH,
    bad_jpeg_at: int | None = None,
    bad_cloud: bool = False,
    gnss_schema: str = "sensor_msgs/msg/NavSatFix",
    lidar_clock_offset_ms: float = 0.0,
    lidar_clock_drift_ppm: float = 0.0,
    metadata: dict[str, str] | None = None,
    craft_image: Callable[[int, bytes], bytes] | None = None,
    status_schema: str = "aiinfra.VehicleStatus",
    status_keys: tuple[str, ...] = STATUS_KEYS,
) -> bytes:
    """An MCAP file as a ROS 2 car records it: 10 Hz camera, 5 Hz GNSS, 10 Hz odom/status.

    ``craft_image(i, jpeg)`` returns the bytes recorded for frame ``i`` in place of its JPEG
    (hostile-input tests). The JSON status channel carries ``status_keys`` under the schema
    name ``status_schema`` (the ros2 profile matches it by its keys, not that name)."""
    log = make_synthetic_log(n_frames, image_height=HEIGHT, image_width=WIDTH, plates_per_frame=0)
    buffer = io.BytesIO()
    writer = Writer(buffer)
    writer.start(profile="ros2", library="test-ros2-recorder")
    encoders: dict[str, Any] = {}
    channels: dict[str, int] = {}

    def write(topic: str, datatype: str, message: dict[str, Any], time_ns: int) -> None:
        if topic not in channels:
            schema = writer.register_schema(datatype, "ros2msg", ros2_msgdef(datatype).encode())
            channels[topic] = writer.register_channel(topic, "cdr", schema)
            encoders[topic] = serialize_dynamic(datatype, ros2_msgdef(datatype))[datatype]
        writer.add_message(channels[topic], time_ns, encoders[topic](message), time_ns)

    json_channels = JsonChannels(writer)

    write(
        "/tf_static",
        "tf2_msgs/msg/TFMessage",
        {
            "transforms": [
                {
                    "header": _header(START_NS, "base_link"),
                    "child_frame_id": "camera_front",
                    "transform": {
                        "translation": {"x": 1.8, "y": 0.0, "z": 1.4},
                        "rotation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0},
                    },
                }
            ]
        },
        START_NS,
    )
    for i, frame in enumerate(log.frames):
        t = START_NS + i * 100_000_000
        image = _jpeg(frame.image)
        if i == bad_jpeg_at:
            image = image[: len(image) // 3]  # a JPEG cut short: header but no scan data
        if craft_image is not None:
            image = craft_image(i, image)
        write(
            "/camera/front/image_raw/compressed",
            "sensor_msgs/msg/CompressedImage",
            {"header": _header(t, "camera_front"), "format": "jpeg", "data": image},
            t,
        )
        if calibration and i % 10 == 0:
            write(
                "/camera/front/camera_info",
                "sensor_msgs/msg/CameraInfo",
                camera_info(t, calibration_width),
                t,
            )
        if i % 2 == 0:
            gnss = {
                "header": _header(t, "gnss"),
                "latitude": frame.latitude,
                "longitude": frame.longitude,
                "altitude": 520.0,
            }
            write("/gnss/fix", gnss_schema, gnss if "NavSat" in gnss_schema else {}, t)
            # The LiDAR stamps with its own clock: off by an offset, and running fast by a drift.
            lidar_stamp = t + round(
                lidar_clock_offset_ms * 1e6 + (t - START_NS) * lidar_clock_drift_ppm * 1e-6
            )
            cloud = _cloud(lidar_stamp, 64, bad_cloud)
            write("/lidar/points", "sensor_msgs/msg/PointCloud2", cloud, t)
        half = frame.heading / 2.0
        write(
            "/odom",
            "nav_msgs/msg/Odometry",
            {
                "header": _header(t, "map"),
                "child_frame_id": "base_link",
                "pose": {
                    "pose": {
                        "position": {"x": frame.x, "y": frame.y, "z": 0.0},
                        "orientation": {
                            "x": 0.0,
                            "y": 0.0,
                            "z": math.sin(half),
                            "w": math.cos(half),
                        },
                    }
                },
            },
            t + 3_000_000,  # odometry runs on its own clock, 3 ms after the camera
        )
        write("/imu/data", "sensor_msgs/msg/Imu", {"header": _header(t, "imu")}, t)
        json_channels.vehicle_status(frame, t + 5_000_000, status_schema, status_keys)
    json_channels.events(log)
    writer.add_metadata("drive_log", metadata if metadata is not None else dict(log.metadata))
    writer.finish()
    return buffer.getvalue()
