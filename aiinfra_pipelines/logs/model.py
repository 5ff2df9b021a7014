"""In-memory form of one drive log, shared by the fleet (which produces it) and the MCAP codec.

A drive log is one contiguous segment that a vehicle-side trigger kept. The MCAP file is the
durable form; this dataclass is what the writer consumes and the reader returns, so the fleet
simulator, the ingestion assets and the tests all speak the same vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from aiinfra_pipelines.logs.rig import Recording

# Keys every drive log's MCAP metadata record ("drive_log") must carry. Validation rejects a log
# whose metadata lacks one of these or carries unknown keys (schema drift).
REQUIRED_METADATA_KEYS: tuple[str, ...] = (
    "metadata_schema_version",
    "log_id",
    "vin",
    "vehicle_model",
    "sensor_config_version",
    "software_version",
    "trigger_config_version",
    "city",
    "weather",
    "lighting",
    "road_type",
    "recorded_at",
)
METADATA_SCHEMA_VERSION = "1"
# The value of what a log cannot tell: a condition nobody recorded, metadata a stock recorder
# never writes (logs.sources.metadata). A value of its own (a slice, a filter), never a guess.
UNKNOWN_VALUE = "unknown"
# Keys a log may carry besides the required ones: the car's anonymizer stamps what it did
# (vehicle.anonymizer). Optional because a recording from before it, or from another fleet,
# has none; the cloud's PII check judges the pixels either way.
OPTIONAL_METADATA_KEYS: tuple[str, ...] = ("anonymizer_version", "anonymizer_regions_blurred")

# The source profile (resources/sources) of the layout below, read by logs.reader; every other
# recording goes through logs.sources.
SIMULATED_PROFILE = "simulated"

# Channel topics, fixed so that any uploader (simulated or a real fleet) lands the same layout.
TOPIC_CAMERA = "/camera/front"  # foxglove.RawImage
TOPIC_LOCATION = "/ego/location"  # foxglove.LocationFix (GPS)
TOPIC_POSE = "/ego/pose"  # foxglove.PoseInFrame (local map frame, metres)
TOPIC_CAN = "/vehicle/can"  # aiinfra.CanSignals
TOPIC_TRIGGERS = "/events/triggers"  # aiinfra.TriggerEvent
TOPIC_GROUND_TRUTH = "/sim/ground_truth"  # aiinfra.GroundTruth (simulation only)
# Transitions of the car's degradation state machine (vehicle.degradation); optional: logs
# from before it, and segments in which the state never changed, have none.
TOPIC_DEGRADATION = "/vehicle/degradation"  # aiinfra.DegradationTransition
# The recording rig (written when a log carries a logs.rig.Recording): calibration once per
# log, a rear camera and a LiDAR per frame, the sensors' mounting as static transforms.
TOPIC_CAMERA_CALIBRATION = "/camera/front/calibration"  # foxglove.CameraCalibration
TOPIC_REAR_CAMERA = "/camera/rear"  # foxglove.CompressedImage (jpeg) or RawImage
TOPIC_REAR_CAMERA_CALIBRATION = "/camera/rear/calibration"  # foxglove.CameraCalibration
TOPIC_LIDAR = "/lidar/points"  # foxglove.PointCloud (x, y, z FLOAT32)
TOPIC_TF_STATIC = "/tf_static"  # foxglove.FrameTransforms
REQUIRED_TOPICS: tuple[str, ...] = (
    TOPIC_CAMERA,
    TOPIC_LOCATION,
    TOPIC_POSE,
    TOPIC_CAN,
    TOPIC_TRIGGERS,
)


@dataclass(frozen=True)
class OtherVehicle:
    """Privileged simulation ground truth for one surrounding vehicle at one frame.

    ``x``/``y`` are metres in the ego-centred frame (x ahead, y left); ``plate_box`` is the
    licence-plate region in image pixels ``(x0, y0, x1, y1)`` so anonymization can blur it.
    """

    vehicle_id: int
    x: float
    y: float
    vx: float
    vy: float
    lane_offset: int  # lane index relative to ego: 0 same lane, +1 left, -1 right
    plate_box: tuple[int, int, int, int] | None = None
    # The same vehicle's plate in the rear camera's image (``Frame.rear_image``), if visible.
    rear_plate_box: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class TriggerEvent:
    """A vehicle-side trigger rule that fired at a frame (e.g. ``hard_brake``)."""

    timestamp_ns: int
    rule: str
    value: float
    threshold: float


@dataclass(frozen=True)
class DegradationEvent:
    """A transition of the car's degradation state machine at ``timestamp_ns`` (log time):
    ``from_state`` -> ``to_state`` (nominal, degraded, minimal_risk), its cause and detail."""

    timestamp_ns: int
    from_state: str
    to_state: str
    cause: str
    detail: str = ""


@dataclass
class Frame:
    """One synchronized sample of all channels at the camera timestamp."""

    timestamp_ns: int
    image: np.ndarray  # H x W x 3, uint8, rgb8
    # GPS (WGS84 degrees) and local pose (metres, radians)
    latitude: float
    longitude: float
    x: float
    y: float
    heading: float
    # CAN
    speed_mps: float
    accel_mps2: float
    steering_rad: float
    brake: float  # 0..1 pedal
    # Simulation ground truth (empty for real fleets)
    lane_index: int = 0
    lane_count: int = 0
    others: list[OtherVehicle] = field(default_factory=list)
    # The recording rig's other sensors (None when the log carries only the front camera):
    # the rear camera (H x W x 3 uint8 rgb8) and LiDAR returns (N x 3 float32, metres in the
    # lidar frame: x ahead, y left, z up).
    rear_image: np.ndarray | None = None
    lidar_points: np.ndarray | None = None


@dataclass
class DriveLog:
    """One kept segment: file-level metadata, frames in time order, and the triggers that fired."""

    metadata: dict[str, str]
    # A list, or frames decoded on read (logs.lazy_frames.LazyFrames) on the streaming path.
    frames: Sequence[Frame]
    events: list[TriggerEvent] = field(default_factory=list)
    # How the car recorded (camera encoding, calibration, transforms); None: the front-camera
    # layout of fleet-6 and earlier, RawImage only. Not read back: a file states it in messages.
    recording: Recording | None = None
    # The degradation state machine's transitions within the segment (time order).
    degradation: list[DegradationEvent] = field(default_factory=list)
    # Frame signals the recording does not carry (a ROS 2 car without a brake report, a log
    # without GNSS): NaN in every frame, and exempt from the finiteness check because of it.
    unknown_signals: frozenset[str] = frozenset()

    @property
    def log_id(self) -> str:
        return self.metadata["log_id"]

    @property
    def duration_s(self) -> float:
        frames = getattr(self.frames, "skeletons", self.frames)  # no decoding for times
        if len(frames) < 2:
            return 0.0
        return (frames[-1].timestamp_ns - frames[0].timestamp_ns) / 1e9
