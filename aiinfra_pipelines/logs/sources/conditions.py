"""Driving conditions a real recording does not state, derived where that is sound.

The simulated fleet knows its lighting, weather and road type; a real car's log usually
carries none of them, yet every slice, gate and quota is keyed on them. Lighting can be derived
soundly: the sun's elevation at the log's GNSS position and recording time decides day or night,
and in twilight the camera's own brightness decides. Weather and road type cannot be read off
a log this reliably, so they are recorded as ``unknown`` — a slice of its own, never a silent
guess. Thresholds live in logs.yaml ``conditions``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np

from aiinfra_pipelines.logs.model import UNKNOWN_VALUE, DriveLog

CONDITION_KEYS: tuple[str, ...] = ("lighting", "weather", "road_type")
UNKNOWN = UNKNOWN_VALUE


def solar_elevation_deg(latitude: float, longitude: float, when: datetime) -> float:
    """The sun's elevation above the horizon (degrees), NOAA's low-precision formulae.

    Accurate to well under a degree: plenty to tell day (> 0) from night (< -6, civil dusk).
    """
    when = when.astimezone(UTC)
    day_of_year = when.timetuple().tm_yday
    hours = when.hour + when.minute / 60.0 + when.second / 3600.0
    gamma = 2.0 * math.pi / 365.0 * (day_of_year - 1 + (hours - 12.0) / 24.0)
    declination = (
        0.006918
        - 0.399912 * math.cos(gamma)
        + 0.070257 * math.sin(gamma)
        - 0.006758 * math.cos(2 * gamma)
        + 0.000907 * math.sin(2 * gamma)
        - 0.002697 * math.cos(3 * gamma)
        + 0.00148 * math.sin(3 * gamma)
    )
    equation_of_time = 229.18 * (
        0.000075
        + 0.001868 * math.cos(gamma)
        - 0.032077 * math.sin(gamma)
        - 0.014615 * math.cos(2 * gamma)
        - 0.040849 * math.sin(2 * gamma)
    )
    solar_minutes = hours * 60.0 + equation_of_time + 4.0 * longitude
    hour_angle = math.radians(solar_minutes / 4.0 - 180.0)
    lat = math.radians(latitude)
    cos_zenith = math.sin(lat) * math.sin(declination) + math.cos(lat) * math.cos(
        declination
    ) * math.cos(hour_angle)
    return 90.0 - math.degrees(math.acos(max(-1.0, min(1.0, cos_zenith))))


def derive_lighting(log: DriveLog, recorded_at: str, rules: Mapping[str, Any]) -> tuple[str, str]:
    """(lighting, how it was decided) from the sun at the first fix, else the images.

    A log without GNSS (NaN positions, an unknown signal) has no sun to ask: the images decide.
    """
    frames = log.frames
    if not frames:
        return UNKNOWN, "no frames"
    try:
        when = datetime.fromisoformat(recorded_at)
    except (TypeError, ValueError):
        when = None
    fix = (frames[0].latitude, frames[0].longitude)
    if when is not None and when.tzinfo is not None and all(map(math.isfinite, fix)):
        elevation = solar_elevation_deg(*fix, when)
        if elevation > float(rules["day_min_sun_elevation_deg"]):
            return "day", f"sun {elevation:.1f} deg above the horizon"
        if elevation < float(rules["night_max_sun_elevation_deg"]):
            return "night", f"sun {elevation:.1f} deg below the horizon"
    brightness = float(np.mean([frame.image.mean() for frame in frames]))
    lighting = "night" if brightness <= float(rules["night_max_mean_brightness"]) else "day"
    return lighting, f"twilight, no time or no fix: mean image brightness {brightness:.0f}"


def fill_conditions(
    metadata: Mapping[str, str], log: DriveLog | None, rules: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """(metadata with every condition key set, {key: how it was derived}) for a real log.

    Conditions the log states are kept as recorded; nothing is overwritten.
    """
    filled = dict(metadata)
    derived: dict[str, str] = {}
    for key in CONDITION_KEYS:
        if filled.get(key):
            continue
        if key == "lighting" and log is not None:
            filled[key], derived[key] = derive_lighting(log, filled.get("recorded_at", ""), rules)
        else:
            filled[key], derived[key] = UNKNOWN, "not recorded; not derivable from the log"
    return filled, derived
