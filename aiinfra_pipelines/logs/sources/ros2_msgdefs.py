"""ROS 2 message definitions (``ros2msg`` text) for the message types the ``ros2`` profile reads.

An MCAP file written by a ROS 2 recorder embeds each channel's full definition (the type, then
every dependency after a ``MSG:`` separator), and ``mcap-ros2-support`` decodes from that text
alone. These are the stock definitions (``sensor_msgs``, ``nav_msgs``, ``geometry_msgs``,
``tf2_msgs`` as shipped with ROS 2 Humble; Autoware's vehicle reports, in both the
``autoware_auto_vehicle_msgs`` and the newer ``autoware_vehicle_msgs`` package; ``can_msgs``
as ``ros2_socketcan`` publishes raw frames) so that tools and tests can *write* the same files a
car's recorder does without a ROS installation. Reading never uses them: a file's own schemas
decode it.
"""

from __future__ import annotations

_SEPARATOR = "=" * 80

_DEFINITIONS: dict[str, str] = {
    "builtin_interfaces/Time": "int32 sec\nuint32 nanosec",
    "std_msgs/Header": "builtin_interfaces/Time stamp\nstring frame_id",
    "sensor_msgs/CompressedImage": "std_msgs/Header header\nstring format\nuint8[] data",
    "sensor_msgs/Image": (
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\n"
        "uint8 is_bigendian\nuint32 step\nuint8[] data"
    ),
    "sensor_msgs/RegionOfInterest": (
        "uint32 x_offset\nuint32 y_offset\nuint32 height\nuint32 width\nbool do_rectify"
    ),
    "sensor_msgs/CameraInfo": (
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring distortion_model\n"
        "float64[] d\nfloat64[9] k\nfloat64[9] r\nfloat64[12] p\nuint32 binning_x\n"
        "uint32 binning_y\nsensor_msgs/RegionOfInterest roi"
    ),
    "sensor_msgs/NavSatStatus": "int8 status\nuint16 service",
    "sensor_msgs/NavSatFix": (
        "std_msgs/Header header\nsensor_msgs/NavSatStatus status\nfloat64 latitude\n"
        "float64 longitude\nfloat64 altitude\nfloat64[9] position_covariance\n"
        "uint8 position_covariance_type"
    ),
    "geometry_msgs/Vector3": "float64 x\nfloat64 y\nfloat64 z",
    "geometry_msgs/Point": "float64 x\nfloat64 y\nfloat64 z",
    "geometry_msgs/Quaternion": "float64 x\nfloat64 y\nfloat64 z\nfloat64 w",
    "geometry_msgs/Pose": "geometry_msgs/Point position\ngeometry_msgs/Quaternion orientation",
    "geometry_msgs/PoseWithCovariance": "geometry_msgs/Pose pose\nfloat64[36] covariance",
    "geometry_msgs/Twist": "geometry_msgs/Vector3 linear\ngeometry_msgs/Vector3 angular",
    "geometry_msgs/TwistWithCovariance": "geometry_msgs/Twist twist\nfloat64[36] covariance",
    "geometry_msgs/Transform": (
        "geometry_msgs/Vector3 translation\ngeometry_msgs/Quaternion rotation"
    ),
    "geometry_msgs/TransformStamped": (
        "std_msgs/Header header\nstring child_frame_id\ngeometry_msgs/Transform transform"
    ),
    "sensor_msgs/Imu": (
        "std_msgs/Header header\ngeometry_msgs/Quaternion orientation\n"
        "float64[9] orientation_covariance\ngeometry_msgs/Vector3 angular_velocity\n"
        "float64[9] angular_velocity_covariance\ngeometry_msgs/Vector3 linear_acceleration\n"
        "float64[9] linear_acceleration_covariance"
    ),
    "sensor_msgs/PointField": (
        "uint8 INT8=1\nuint8 UINT8=2\nuint8 INT16=3\nuint8 UINT16=4\nuint8 INT32=5\n"
        "uint8 UINT32=6\nuint8 FLOAT32=7\nuint8 FLOAT64=8\n"
        "string name\nuint32 offset\nuint8 datatype\nuint32 count"
    ),
    "sensor_msgs/PointCloud2": (
        "std_msgs/Header header\nuint32 height\nuint32 width\nsensor_msgs/PointField[] fields\n"
        "bool is_bigendian\nuint32 point_step\nuint32 row_step\nuint8[] data\nbool is_dense"
    ),
    "nav_msgs/Odometry": (
        "std_msgs/Header header\nstring child_frame_id\n"
        "geometry_msgs/PoseWithCovariance pose\ngeometry_msgs/TwistWithCovariance twist"
    ),
    "tf2_msgs/TFMessage": "geometry_msgs/TransformStamped[] transforms",
    "can_msgs/Frame": (
        "std_msgs/Header header\nuint32 id\nbool is_rtr\nbool is_extended\nbool is_error\n"
        "uint8 dlc\nuint8[8] data"
    ),
}
# Autoware's vehicle interface reports; the package was renamed, the messages were not.
_VELOCITY_REPORT = (
    "std_msgs/Header header\nfloat32 longitudinal_velocity\nfloat32 lateral_velocity\n"
    "float32 heading_rate"
)
_STEERING_REPORT = "builtin_interfaces/Time stamp\nfloat32 steering_tire_angle"
for _package in ("autoware_auto_vehicle_msgs", "autoware_vehicle_msgs"):
    _DEFINITIONS[f"{_package}/VelocityReport"] = _VELOCITY_REPORT
    _DEFINITIONS[f"{_package}/SteeringReport"] = _STEERING_REPORT


def _dependencies(name: str, seen: list[str]) -> list[str]:
    for line in _DEFINITIONS[name].splitlines():
        field_type = line.split()[0].split("[")[0]
        if "/" in field_type and field_type not in seen:
            seen.append(field_type)
            _dependencies(field_type, seen)
    return seen


def ros2_msgdef(datatype: str) -> str:
    """The full ``ros2msg`` schema text for ``datatype`` (``sensor_msgs/msg/CompressedImage``)."""
    name = datatype.replace("/msg/", "/")
    if name not in _DEFINITIONS:
        raise KeyError(f"no ROS 2 definition shipped for {datatype}")
    parts = [_DEFINITIONS[name]]
    for dependency in _dependencies(name, []):
        parts.append(f"{_SEPARATOR}\nMSG: {dependency}\n{_DEFINITIONS[dependency]}")
    return "\n".join(parts)
