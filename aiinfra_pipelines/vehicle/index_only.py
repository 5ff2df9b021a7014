"""Which kept segments a car sends whole, and what it sends for the rest: an index record.

Bandwidth goes to what the platform will learn from. A condition sample on an empty road
(the night trigger fired, nothing else happened, no traffic around) is cheap to describe and
rarely worth its megabytes, so the car uploads only its index record: the log's metadata, each
frame's signals and a small thumbnail. The raw log stays in the car's cache, where a pull
request from the platform can still reach it (``vehicle.outbox.Outbox.serve_pulls``). Rules
in ``triggers.yaml`` ``index_only``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.logs.model import DriveLog

INDEX_RECORD_KIND = "aiinfra.index_record"
INDEX_RECORD_VERSION = 1
TRIGGERS_FILE = "triggers.yaml"
FRAME_SIGNALS = (
    "timestamp_ns",
    "latitude",
    "longitude",
    "heading",
    "speed_mps",
    "accel_mps2",
    "steering_rad",
    "brake",
    "lane_index",
    "lane_count",
)


@dataclass(frozen=True)
class IndexOnlySettings:
    enabled: bool
    rules: frozenset[str]
    max_mean_vehicles_in_view: float
    thumbnail_downscale: int
    thumbnail_jpeg_quality: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> IndexOnlySettings:
        config = settings_section(TRIGGERS_FILE, "", config).values
        section = config.get("index_only")
        if not isinstance(section, Mapping):
            raise KeyError(f"{TRIGGERS_FILE} has no index_only section")
        return cls(
            enabled=bool(section["enabled"]),
            rules=frozenset(str(rule) for rule in section["rules"]),
            max_mean_vehicles_in_view=float(section["max_mean_vehicles_in_view"]),
            thumbnail_downscale=int(section["thumbnail_downscale"]),
            thumbnail_jpeg_quality=int(section["thumbnail_jpeg_quality"]),
        )


def fired_rules(log: DriveLog) -> list[str]:
    return sorted({event.rule for event in log.events})


def is_low_value(log: DriveLog, settings: IndexOnlySettings) -> bool:
    """Only condition samples fired in it, and the road around the car was quiet."""
    rules = set(fired_rules(log))
    if not settings.enabled or not rules or not rules <= settings.rules or not log.frames:
        return False
    traffic = float(np.mean([len(frame.others) for frame in log.frames]))
    return traffic <= settings.max_mean_vehicles_in_view


def thumbnail(image: np.ndarray, downscale: int, quality: int) -> dict[str, Any]:
    """The image shrunk by block means (``downscale`` per side) as a small JPEG.

    The image is the anonymized one the car would have uploaded, and at 1/8 per side a plate
    is under one pixel: the thumbnail carries no readable plate.
    """
    import cv2

    height, width = (image.shape[0] // downscale), (image.shape[1] // downscale)
    blocks = image[: height * downscale, : width * downscale].astype(np.float32)
    small = blocks.reshape(height, downscale, width, downscale, 3).mean(axis=(1, 3))
    bgr = np.ascontiguousarray(np.rint(small).astype(np.uint8)[:, :, ::-1])
    ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("OpenCV could not encode the thumbnail")
    return {
        "encoding": "jpeg",
        "width": width,
        "height": height,
        "data_base64": base64.b64encode(encoded.tobytes()).decode("ascii"),
    }


def _signal_stats(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {
        "min": float(array.min()),
        "mean": float(array.mean()),
        "max": float(array.max()),
    }


def index_record(log: DriveLog, raw: bytes, settings: IndexOnlySettings) -> bytes:
    """The JSON a car sends instead of ``raw`` (the encoded log it keeps in its cache).

    ``raw_sha256``/``raw_bytes`` name the log a later pull will deliver, so the platform can
    tell it is the same recording.
    """
    frames = [
        {
            **{name: getattr(frame, name) for name in FRAME_SIGNALS},
            "vehicles_in_view": len(frame.others),
        }
        for frame in log.frames
    ]
    middle = log.frames[len(log.frames) // 2]
    record = {
        "kind": INDEX_RECORD_KIND,
        "version": INDEX_RECORD_VERSION,
        "log_id": log.log_id,
        "metadata": dict(log.metadata),
        "raw_sha256": hashlib.sha256(raw).hexdigest(),
        "raw_bytes": len(raw),
        "frames": frames,
        "events": [[event.timestamp_ns, event.rule] for event in log.events],
        "signal_stats": {
            name: _signal_stats([getattr(frame, name) for frame in log.frames])
            for name in ("speed_mps", "accel_mps2", "steering_rad", "brake")
        },
        "thumbnail": thumbnail(
            middle.image, settings.thumbnail_downscale, settings.thumbnail_jpeg_quality
        ),
    }
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
