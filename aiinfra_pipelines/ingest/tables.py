"""Pure functions that turn an anonymized drive log into the tables ingestion publishes.

``anonymized_frames`` keeps what training needs (pixels, signals, ego-relative ground truth)
and nothing that identifies a vehicle or an exact place: no VIN, no absolute map pose, GPS
already coarsened. ``scene_index`` is the searchable catalogue — one row per frame with every
log tag, the frame's signals and event flags — and deliberately holds no pixels, so slicing the
whole fleet's data by lighting × weather × road type stays cheap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.logs.model import DriveLog, Frame

# Log tags copied onto every scene-index row (the anonymized metadata, VIN already replaced).
INDEX_TAGS: tuple[str, ...] = (
    "log_id",
    "vehicle_pseudonym",
    "vehicle_model",
    "sensor_config_version",
    "software_version",
    "trigger_config_version",
    "city",
    "weather",
    "lighting",
    "road_type",
    "recorded_at",
    # SHA-256 of the log's camera calibrations and static transforms (logs.rig): logs with
    # one hash were calibrated alike; "" for a log that recorded no calibration.
    "calibration_sha256",
    # "<version>+<detector>+..." of the car's anonymizer (vehicle.anonymizer); "" if none.
    "anonymizer_version",
)
# The frames table's per-frame sensor payloads (bytes): megabytes a frame, never in the index.
PAYLOAD_COLUMNS: tuple[str, ...] = ("image", "rear_image", "lidar_points")
SIGNAL_COLUMNS: tuple[str, ...] = (
    "speed_mps",
    "accel_mps2",
    "steering_rad",
    "brake",
)


def trigger_rule_names() -> list[str]:
    """Every vehicle-side trigger rule, so each gets an ``event_<rule>`` column even when unseen."""
    rules = load_resource_yaml("triggers.yaml").get("rules", {})
    names = rules.keys() if isinstance(rules, dict) else (rule["name"] for rule in rules)
    return sorted(str(name) for name in names)


def slice_name(lighting: str, weather: str, road_type: str) -> str:
    """The evaluation slice a frame belongs to: lighting × weather × road type."""
    return f"{lighting}/{weather}/{road_type}"


def _events_per_frame(timestamps: np.ndarray, events: Iterable[tuple[int, str]]) -> list[set[str]]:
    """Attach each trigger event to the frame nearest in time."""
    per_frame: list[set[str]] = [set() for _ in range(len(timestamps))]
    if len(timestamps) == 0:
        return per_frame
    for timestamp_ns, rule in events:
        per_frame[int(np.abs(timestamps - timestamp_ns).argmin())].add(rule)
    return per_frame


def _rear_columns(frame: Frame) -> dict[str, object]:
    """The rear camera (anonymized rgb8, empty when the log has none) and LiDAR returns.

    The front camera keeps the ``image`` column every consumer reads; the other sensors sit
    beside it so training, mining and evaluation read exactly what they read before.
    """
    rear = frame.rear_image
    points = frame.lidar_points
    rear_bytes = b"" if rear is None else np.ascontiguousarray(rear, dtype=np.uint8).tobytes()
    return {
        "rear_image_height": 0 if rear is None else int(rear.shape[0]),
        "rear_image_width": 0 if rear is None else int(rear.shape[1]),
        "rear_image": rear_bytes,
        "lidar_point_count": 0 if points is None else len(points),
        "lidar_points": b""
        if points is None
        else np.ascontiguousarray(points, dtype="<f4").tobytes(),  # N x (x, y, z) float32
    }


def _frame_row(log_id: str, pseudonym: str, index: int, frame: Frame) -> dict[str, object]:
    image = np.ascontiguousarray(frame.image, dtype=np.uint8)
    return {
        "log_id": log_id,
        "frame_index": index,
        "timestamp_ns": frame.timestamp_ns,
        "vehicle_pseudonym": pseudonym,
        "latitude": frame.latitude,
        "longitude": frame.longitude,
        "heading": frame.heading,
        "speed_mps": frame.speed_mps,
        "accel_mps2": frame.accel_mps2,
        "steering_rad": frame.steering_rad,
        "brake": frame.brake,
        "lane_index": frame.lane_index,
        "lane_count": frame.lane_count,
        "ground_truth": json.dumps(
            [
                {
                    "vehicle_id": other.vehicle_id,
                    "x": other.x,
                    "y": other.y,
                    "vx": other.vx,
                    "vy": other.vy,
                    "lane_offset": other.lane_offset,
                }
                for other in frame.others
            ]
        ),
        "image_height": image.shape[0],
        "image_width": image.shape[1],
        "image_encoding": "rgb8",
        "image": image.tobytes(),
        **_rear_columns(frame),
    }


def frames_table(log: DriveLog) -> pd.DataFrame:
    """One row per frame of an anonymized log: pixels, signals, coarse GPS, relative truth."""
    pseudonym = log.metadata["vehicle_pseudonym"]
    return pd.DataFrame(
        [_frame_row(log.log_id, pseudonym, i, frame) for i, frame in enumerate(log.frames)]
    )


def write_frames_parquet(
    log: DriveLog, path: str | os.PathLike[str], frames_per_row_group: int
) -> pd.DataFrame:
    """:func:`frames_table` written to ``path`` one row group at a time; returns the table
    without its payload columns (what the scene index reads).

    A lazy log (``logs.lazy_frames``) is decoded, anonymized and written ``frames_per_row_group``
    frames at a time, so writing a 10-minute log holds one row group, not the log's pixels. The
    file is the one ``frames_table`` would give (same columns, types and pandas metadata).
    """
    if frames_per_row_group < 1:
        raise ValueError(f"frames_per_row_group must be at least 1, got {frames_per_row_group}")
    pseudonym = log.metadata["vehicle_pseudonym"]
    signals: list[pd.DataFrame] = []
    writer: pq.ParquetWriter | None = None
    window: list[dict[str, object]] = []

    def flush() -> None:
        nonlocal writer
        frame = pd.DataFrame(window)
        signals.append(frame.drop(columns=list(PAYLOAD_COLUMNS)))
        if writer is None:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            writer = pq.ParquetWriter(path, table.schema)
        else:
            table = pa.Table.from_pandas(frame, schema=writer.schema, preserve_index=False)
        writer.write_table(table)
        window.clear()

    try:
        for index, frame in enumerate(log.frames):
            window.append(_frame_row(log.log_id, pseudonym, index, frame))
            if len(window) == frames_per_row_group:
                flush()
        if window or writer is None:
            flush()
    finally:
        if writer is not None:
            writer.close()
    return pd.concat(signals, ignore_index=True)


def scene_index_table(
    frames: pd.DataFrame,
    *,
    tags: dict[str, str],
    events: Iterable[tuple[int, str]],
    rule_names: Iterable[str],
    source_branch: str,
    source_commit: str,
    log_key: str,
    frames_object: str,
    raw_available: bool = True,
    log_sha256: str = "",
) -> pd.DataFrame:
    """One row per frame with every log tag, the frame's signals and one flag per trigger rule.

    Built from the anonymized frames table (never from the raw log), so nothing that was
    removed by anonymization can leak back into the index.
    """
    timestamps = frames["timestamp_ns"].to_numpy(dtype=np.int64)
    per_frame = _events_per_frame(timestamps, events)
    start_ns = int(timestamps[0]) if len(timestamps) else 0
    rows = len(frames)
    # Built as one mapping of columns (inserting columns one by one into a DataFrame costs
    # more than everything else here, and this runs once per log at fleet throughput).
    columns: dict[str, object] = {tag: [tags.get(tag, "")] * rows for tag in INDEX_TAGS}
    columns["frame_index"] = frames["frame_index"].to_numpy()
    columns["timestamp_ns"] = timestamps
    columns["t_rel_s"] = (timestamps - start_ns) / 1e9
    columns["slice"] = [
        slice_name(tags.get("lighting", ""), tags.get("weather", ""), tags.get("road_type", ""))
    ] * rows
    for column in ("latitude", "longitude", *SIGNAL_COLUMNS, "lane_index", "lane_count"):
        columns[column] = frames[column].to_numpy()
    if "vehicles_in_view" in frames:  # an index record counts them on the car
        columns["vehicles_in_view"] = frames["vehicles_in_view"].to_numpy()
    else:
        columns["vehicles_in_view"] = [len(json.loads(gt)) for gt in frames["ground_truth"]]
    columns["lidar_point_count"] = (
        frames["lidar_point_count"].to_numpy() if "lidar_point_count" in frames else [0] * rows
    )
    columns["events"] = [",".join(sorted(names)) for names in per_frame]
    for rule in rule_names:
        columns[f"event_{rule}"] = [rule in names for names in per_frame]
    columns["source_branch"] = [source_branch] * rows
    columns["source_commit"] = [source_commit] * rows
    columns["log_key"] = [log_key] * rows
    # SHA-256 of the log's bytes as the car recorded them: a content id that anything derived
    # from the log (a regression scenario's seeds) can rest on, whatever commit landed it.
    columns["log_sha256"] = [log_sha256] * rows
    columns["frames_object"] = [frames_object] * rows
    # False for a segment indexed from its index record: its raw log is still on the car
    # (ingest.pulls), so it can be queried and pulled but not trained on.
    columns["raw_available"] = [raw_available] * rows
    return pd.DataFrame(columns)
