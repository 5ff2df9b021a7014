"""ROS 2 bags as ``ros2 bag record -s mcap`` writes them, through the stock ROS 2 writer.

Every message goes through ``mcap_ros2.writer.Writer`` (it registers each ``ros2msg`` schema
and CDR channel itself); there is no JSON channel and no ``drive_log`` record, only the
``rosbag2`` metadata record the real recorder adds. Two topic layouts:

- ``generic``: common ROS names; vehicle state only in ``/odom`` (Odometry, with its twist)
  and ``/imu/data``; GNSS on ``/gnss/fix``; a LiDAR and static transforms.
- ``autoware``: Autoware's names; Odometry on ``/localization/kinematic_state``, the vehicle
  interface's ``VelocityReport``/``SteeringReport``, the raw bus on ``/from_can_bus``
  (``can_msgs/msg/Frame``: brake and acceleration frames as the ros2 profile's CAN table
  decodes them, among frames nobody reads), and no GNSS at all.

Values follow ``make_synthetic_log``'s frames, so a test can compare what it reads back.
"""

from __future__ import annotations

import io
import math
from typing import Any

import yaml
from mcap.records import Schema
from mcap_ros2.writer import Writer

from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.sources.ros2_msgdefs import ros2_msgdef
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines_tests.support.ros2_recording import (
    HEIGHT,
    START_NS,
    WIDTH,
    _cloud,
    _header,
    _jpeg,
    camera_info,
)

FRAME_NS = 100_000_000  # a 10 Hz camera
IMU_PER_FRAME = 5  # 50 Hz
ODOM_PER_FRAME = 2  # 20 Hz
# The ros2 profile's CAN table (resources/sources/ros2.yaml ``can``).
CAN_BRAKE_ID, CAN_ACCEL_ID, CAN_OTHER_ID = 0x1A0, 0x0B0, 0x3E9
BRAKE_STEPS = 255  # the brake pedal byte: 0..255
ACCEL_STEP = 0.001  # m/s^2 per count of the signed 16-bit acceleration

LAYOUTS: dict[str, dict[str, str]] = {
    "generic": {
        "camera": "/camera/front/image_raw/compressed",
        "camera_info": "/camera/front/camera_info",
        "odometry": "/odom",
        "imu": "/imu/data",
        "gnss": "/gnss/fix",
        "lidar": "/lidar/points",
        "tf_static": "/tf_static",
    },
    "autoware": {
        "camera": "/sensing/camera/camera0/image_rect_color/compressed",
        "camera_info": "/sensing/camera/camera0/camera_info",
        "odometry": "/localization/kinematic_state",
        "imu": "/sensing/imu/imu_data",
        "velocity": "/vehicle/status/velocity_status",
        "steering": "/vehicle/status/steering_status",
        "can": "/from_can_bus",
    },
}


def synthetic_drive(n_frames: int) -> DriveLog:
    """The drive both layouts record (and a test compares against)."""
    return make_synthetic_log(n_frames, image_height=HEIGHT, image_width=WIDTH, plates_per_frame=0)


class _Bag:
    """The stock writer, with one schema registered per message type."""

    def __init__(self, buffer: io.BytesIO) -> None:
        self.writer = Writer(buffer)
        self._schemas: dict[str, Schema] = {}
        self.counts: dict[str, tuple[str, int]] = {}

    def write(self, topic: str, datatype: str, message: dict[str, Any], time_ns: int) -> None:
        if datatype not in self._schemas:
            self._schemas[datatype] = self.writer.register_msgdef(datatype, ros2_msgdef(datatype))
        self.writer.write_message(topic, self._schemas[datatype], message, time_ns, time_ns)
        _type, count = self.counts.get(topic, (datatype, 0))
        self.counts[topic] = (datatype, count + 1)

    def finish(self, start_ns: int, end_ns: int) -> None:
        """The ``rosbag2`` record as rosbag2_storage_mcap writes it: the bag's own metadata."""
        info = {
            "rosbag2_bagfile_information": {
                "version": 8,
                "storage_identifier": "mcap",
                "duration": {"nanoseconds": end_ns - start_ns},
                "starting_time": {"nanoseconds_since_epoch": start_ns},
                "message_count": sum(count for _type, count in self.counts.values()),
                "topics_with_message_count": [
                    {
                        "topic_metadata": {
                            "name": topic,
                            "type": datatype,
                            "serialization_format": "cdr",
                        },
                        "message_count": count,
                    }
                    for topic, (datatype, count) in sorted(self.counts.items())
                ],
                "compression_format": "",
                "compression_mode": "",
                "ros_distro": "humble",
            }
        }
        self.writer.add_metadata(
            "rosbag2",
            {"serialized_metadata": yaml.safe_dump(info, sort_keys=False), "ROS_DISTRO": "humble"},
        )
        self.writer.finish()


def _quaternion(heading: float) -> dict[str, float]:
    return {"x": 0.0, "y": 0.0, "z": math.sin(heading / 2.0), "w": math.cos(heading / 2.0)}


def _odometry(frame: Any, time_ns: int, speed: float) -> dict[str, Any]:
    return {
        "header": _header(time_ns, "map"),
        "child_frame_id": "base_link",
        "pose": {
            "pose": {
                "position": {"x": frame.x, "y": frame.y, "z": 0.0},
                "orientation": _quaternion(frame.heading),
            },
            "covariance": [0.0] * 36,
        },
        "twist": {
            "twist": {
                "linear": {"x": speed, "y": 0.0, "z": 0.0},
                "angular": {"x": 0.0, "y": 0.0, "z": 0.0},
            },
            "covariance": [0.0] * 36,
        },
    }


def _imu(frame: Any, time_ns: int) -> dict[str, Any]:
    return {
        "header": _header(time_ns, "imu"),
        "orientation": _quaternion(frame.heading),
        "orientation_covariance": [0.0] * 9,
        "angular_velocity": {"x": 0.0, "y": 0.0, "z": 0.0},
        "angular_velocity_covariance": [0.0] * 9,
        "linear_acceleration": {"x": frame.accel_mps2, "y": 0.0, "z": 9.81},
        "linear_acceleration_covariance": [0.0] * 9,
    }


def _can_frame(time_ns: int, frame_id: int, data: bytes) -> dict[str, Any]:
    return {
        "header": _header(time_ns, "can0"),
        "id": frame_id,
        "is_rtr": False,
        "is_extended": False,
        "is_error": False,
        "dlc": len(data),
        "data": data.ljust(8, b"\x00"),
    }


def _can_frames(frame: Any, time_ns: int) -> list[tuple[int, bytes]]:
    """The chassis frames of one camera period (the ros2 profile's CAN table)."""
    brake = bytes([0x00, 0x7F, round(frame.brake * BRAKE_STEPS), 0x00])
    accel = round(frame.accel_mps2 / ACCEL_STEP).to_bytes(2, "big", signed=True)
    return [(CAN_OTHER_ID, b"\x11\x22\x33"), (CAN_BRAKE_ID, brake), (CAN_ACCEL_ID, accel)]


def write_ros2_bag(
    layout: str = "generic",
    n_frames: int = 20,
    *,
    camera: bool = True,
    nan_speed_at: int | None = None,
) -> bytes:
    """A bag in ``layout`` (``LAYOUTS``); ``camera=False`` records no front camera (nor its
    calibration), ``nan_speed_at`` makes the odometry's speed NaN around that frame."""
    topics = LAYOUTS[layout]
    drive = synthetic_drive(n_frames)
    buffer = io.BytesIO()
    bag = _Bag(buffer)
    if "tf_static" in topics:
        transform = {
            "header": _header(START_NS, "base_link"),
            "child_frame_id": "camera_front",
            "transform": {
                "translation": {"x": 1.8, "y": 0.0, "z": 1.4},
                "rotation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0},
            },
        }
        bag.write(
            topics["tf_static"], "tf2_msgs/msg/TFMessage", {"transforms": [transform]}, START_NS
        )
    for i, frame in enumerate(drive.frames):
        t = START_NS + i * FRAME_NS
        if camera:
            image = {
                "header": _header(t, "camera_front"),
                "format": "jpeg",
                "data": _jpeg(frame.image),
            }
            bag.write(topics["camera"], "sensor_msgs/msg/CompressedImage", image, t)
            if i % 10 == 0:
                bag.write(topics["camera_info"], "sensor_msgs/msg/CameraInfo", camera_info(t), t)
        speed = math.nan if i == nan_speed_at else frame.speed_mps
        for k in range(ODOM_PER_FRAME):
            at = t + 3_000_000 + k * FRAME_NS // ODOM_PER_FRAME
            bag.write(topics["odometry"], "nav_msgs/msg/Odometry", _odometry(frame, at, speed), at)
        for k in range(IMU_PER_FRAME):
            at = t + k * FRAME_NS // IMU_PER_FRAME
            bag.write(topics["imu"], "sensor_msgs/msg/Imu", _imu(frame, at), at)
        if "gnss" in topics and i % 2 == 0:
            fix = {
                "header": _header(t, "gnss"),
                "latitude": frame.latitude,
                "longitude": frame.longitude,
                "altitude": 520.0,
            }
            bag.write(topics["gnss"], "sensor_msgs/msg/NavSatFix", fix, t)
            bag.write(topics["lidar"], "sensor_msgs/msg/PointCloud2", _cloud(t, 64, False), t)
        if "velocity" in topics:
            at = t + 4_000_000
            velocity = {
                "header": _header(at, "base_link"),
                "longitudinal_velocity": frame.speed_mps,
                "lateral_velocity": 0.0,
                "heading_rate": 0.0,
            }
            bag.write(
                topics["velocity"], "autoware_auto_vehicle_msgs/msg/VelocityReport", velocity, at
            )
            steering = {
                "stamp": {"sec": at // 1_000_000_000, "nanosec": at % 1_000_000_000},
                "steering_tire_angle": frame.steering_rad,
            }
            bag.write(topics["steering"], "autoware_vehicle_msgs/msg/SteeringReport", steering, at)
        if "can" in topics:
            for k, (frame_id, data) in enumerate(_can_frames(frame, t)):
                at = t + (k + 1) * 1_000_000
                bag.write(topics["can"], "can_msgs/msg/Frame", _can_frame(at, frame_id, data), at)
    bag.finish(START_NS, START_NS + (n_frames - 1) * FRAME_NS)
    return buffer.getvalue()
