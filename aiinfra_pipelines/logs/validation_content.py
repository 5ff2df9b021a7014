"""Content checks on decoded frames: timing, signal values, images, events, residual PII.

They need only a ``DriveLog``, not the file it came from, so the fleet can run them before
writing and the index-only ingest path can reuse the timing and signal checks. Timing, signal
and event checks read a lazy log's frame skeletons (:func:`.lazy_frames.signal_frames`, no
decoding); the image checks and the PII check decode frame by frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from aiinfra_pipelines.logs.lazy_frames import signal_frames
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.pii_check import (
    RESIDUAL_PII,
    PiiFinding,
    describe_findings,
    find_residual_pii,
)
from aiinfra_pipelines.logs.reader import rate_hz
from aiinfra_pipelines.logs.validation_report import Reason
from aiinfra_pipelines.logs.validation_rules import resolve_rules

# Frame attributes checked for finiteness; the ones with a range in logs.yaml are also bounded.
SIGNALS: tuple[str, ...] = (
    "speed_mps",
    "accel_mps2",
    "steering_rad",
    "brake",
    "latitude",
    "longitude",
    "x",
    "y",
    "heading",
)

_LOCATION_SIGNALS = frozenset({"latitude", "longitude"})


def check_timing(times_ns: Iterable[int], rules: dict[str, Any]) -> list[Reason]:
    """Count, strict monotonicity, average rate and the longest gap of camera frames."""
    times = np.asarray(list(times_ns), dtype=np.int64)
    reasons = []
    if len(times) < rules["min_frames"]:
        reasons.append(
            Reason("too_few_frames", f"{len(times)} frames, need at least {rules['min_frames']}")
        )
    steps = np.diff(times)
    backwards = np.flatnonzero(steps <= 0)
    if backwards.size:
        reasons.append(
            Reason(
                "non_monotonic_time",
                f"{backwards.size} frame(s) not after their predecessor, first at index "
                f"{int(backwards[0]) + 1}",
            )
        )
    rate = rate_hz(times)
    low, high = rules["frame_rate_hz"]["min"], rules["frame_rate_hz"]["max"]
    if rate is not None and not low <= rate <= high:
        reasons.append(
            Reason("frame_rate_out_of_range", f"frame rate {rate:.2f} Hz not in [{low}, {high}]")
        )
    if steps.size and steps.max() / 1e9 > rules["max_gap_s"]:
        reasons.append(
            Reason(
                "time_gap",
                f"gap of {steps.max() / 1e9:.3f} s between frames exceeds {rules['max_gap_s']} s",
            )
        )
    return reasons


def check_signal(name: str, values: np.ndarray, bounds: dict | None) -> list[Reason]:
    """Finiteness, and the range ``bounds`` gives; positions are never echoed in messages."""
    finite = np.isfinite(values)
    reasons = []
    if not finite.all():
        bad = np.flatnonzero(~finite)
        reasons.append(
            Reason(
                "non_finite_signal",
                f"{name} is NaN/inf in {bad.size} frame(s), first at index {int(bad[0])}",
            )
        )
    if bounds is not None:
        outside = finite & ((values < bounds["min"]) | (values > bounds["max"]))
        if outside.any():
            worst = values[outside][np.argmax(np.abs(values[outside]))]
            # Reasons are published (quarantine table, Dagster metadata): never echo a position.
            example = "" if name in _LOCATION_SIGNALS else f", e.g. {float(worst):g}"
            reasons.append(
                Reason(
                    "signal_out_of_range",
                    f"{name} outside [{bounds['min']}, {bounds['max']}] in "
                    f"{int(outside.sum())} frame(s){example}",
                )
            )
    return reasons


def check_signals(log: DriveLog, rules: dict[str, Any]) -> list[Reason]:
    """Every signal finite, and within its physical range where logs.yaml gives one.

    A signal the recording does not carry (``log.unknown_signals``: NaN by construction) is
    exempt; a NaN in a signal the log does carry is still ``non_finite_signal``.
    """
    reasons = []
    frames = signal_frames(log.frames)
    for name in SIGNALS:
        if name in log.unknown_signals:
            continue
        values = np.array([getattr(frame, name) for frame in frames], dtype=np.float64)
        reasons += check_signal(name, values, rules["ranges"].get(name))
    event_values = np.array([e.value for e in log.events], dtype=np.float64)
    reasons += check_signal("trigger value", event_values, None)
    return reasons


def check_images(log: DriveLog) -> list[Reason]:
    """Camera frames must be nonempty and all of one size (a model input has fixed dims)."""
    shapes = [frame.image.shape for frame in log.frames]
    reasons = []
    empty = [i for i, shape in enumerate(shapes) if 0 in shape]
    if empty:
        reasons.append(
            Reason("empty_image", f"{len(empty)} empty camera frame(s), first at index {empty[0]}")
        )
    distinct = sorted({shape for shape in shapes})
    if len(distinct) > 1:
        reasons.append(
            Reason("inconsistent_image_dims", f"camera frames have several sizes: {distinct}")
        )
    return reasons


def check_events(log: DriveLog) -> list[Reason]:
    """A trigger must fire inside the segment it kept, or the segment is not what it claims."""
    if not log.frames:
        return []
    times = [frame.timestamp_ns for frame in signal_frames(log.frames)]
    first, last = min(times), max(times)
    outside = [e for e in log.events if not first <= e.timestamp_ns <= last]
    return [
        Reason("event_outside_log", f"trigger {e.rule} at {e.timestamp_ns} is outside the log")
        for e in outside
    ]


def check_residual_pii(
    log: DriveLog, rules: dict[str, Any]
) -> tuple[list[Reason], list[PiiFinding]]:
    """The cloud's PII check as a quarantine reason, with every finding for the report."""
    settings = rules["pii_check"]
    findings = find_residual_pii(log, settings)
    if not findings:
        return [], []
    message = describe_findings(findings, int(settings["listed_in_reason"]))
    return [Reason(RESIDUAL_PII, message)], findings


def check_log_content(log: DriveLog, rules: dict[str, Any] | None = None) -> list[Reason]:
    """Content checks on an in-memory log (also usable by the fleet before writing)."""
    resolved = resolve_rules(rules)
    return [
        *check_timing((frame.timestamp_ns for frame in signal_frames(log.frames)), resolved),
        *check_signals(log, resolved),
        *check_images(log),
        *check_events(log),
    ]
