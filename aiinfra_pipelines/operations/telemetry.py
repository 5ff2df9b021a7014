"""Fleet telemetry: the vehicle-side aggregate record, as a car's agent builds it.

A car cannot upload every frame, but it can report what its engine did: one record per drive
(or reporting window) with the engine it ran, how many frames it perceived, inference latency
percentiles, a confidence histogram, fallback frames and activations, near misses, collisions
and hard brakes. Records land like drive logs (raw, with the VIN, on ``ingest-<batch>``
branches); ``fleet_telemetry`` validates them, quarantines bad ones with every reason, replaces
the VIN with the keyed pseudonym and publishes the rest to ``main``, where rollout compares the
candidate cohort with the control cohort and the drift monitor reads confidences.

The record's fields and their published form: :mod:`.telemetry_schema`; its checks:
:mod:`.telemetry_checks`; parsing, pseudonymizing and quarantining landed uploads:
:mod:`.telemetry_intake`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.fleet.safety_events import CollisionRules, episode_safety_events

from .outbox_telemetry import outbox_fields
from .telemetry_schema import (
    DEGRADATION_DEFAULTS,
    LATENCY_FIELDS,
    TRANSITION_FIELDS,
)


@dataclass(frozen=True)
class TelemetrySettings:
    """``resources/operations.yaml`` → ``telemetry``."""

    upload_prefix: str
    confidence_bins: int
    cohorts: tuple[str, ...]
    max_frames: int
    max_latency_ms: float
    quarantine_listed: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> TelemetrySettings:
        section = settings_section("operations.yaml", "telemetry", config)
        limits = section.section("limits")
        return cls(
            upload_prefix=section.str("upload_prefix"),
            confidence_bins=section.int("confidence_bins"),
            cohorts=tuple(str(c) for c in section.list("cohorts")),
            max_frames=limits.int("max_frames"),
            max_latency_ms=limits.float("max_latency_ms"),
            quarantine_listed=section.int("quarantine_listed"),
        )

    @property
    def confidence_edges(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.confidence_bins + 1)


# ---------------------------------------------------------------------------------- building
def confidence_histogram(confidences: Sequence[float], bins: int) -> list[int]:
    """Counts of per-frame confidences in ``bins`` equal bins on [0, 1] (1.0 in the last)."""
    values = np.clip(np.asarray(confidences, dtype=float), 0.0, 1.0)
    index = np.minimum((values * bins).astype(np.int64), bins - 1)
    return [int(count) for count in np.bincount(index, minlength=bins)]


def telemetry_record(
    *,
    record_id: str,
    vin: str,
    vehicle_model: str,
    software_version: str,
    engine_sha256: str,
    cohort: str,
    recorded_at: str,
    latencies_ms: Sequence[float],
    confidences: Sequence[float],
    fallback_flags: Sequence[bool] | None = None,
    fallback_counts: tuple[int, int] | None = None,
    near_misses: int = 0,
    collisions: int = 0,
    hard_brakes: int = 0,
    at_fault_collisions: int | None = None,
    shadow: tuple[str, int, int] | None = None,
    degradation: Mapping[str, Any] | None = None,
    outbox: Mapping[str, Any] | None = None,
    settings: TelemetrySettings | None = None,
) -> dict[str, Any]:
    """One vehicle-side record from per-frame series, as a car's telemetry agent builds it.

    ``outbox`` is the car's outbox snapshot (``vehicle.outbox.Outbox.status()``) when it
    reports one (``operations.outbox_telemetry``).

    ``shadow`` is (engine sha256, frames, agreeing frames) when an engine ran in shadow mode;
    ``degradation`` holds the :data:`DEGRADATION_DEFAULTS` fields when the car reports them.

    Fallback comes either as per-frame ``fallback_flags`` or, where only totals are known, as
    ``fallback_counts`` = (fallback frames, fallback activations).
    """
    settings = settings or TelemetrySettings.load()
    fallback_frames, onsets = _fallback_totals(fallback_flags, fallback_counts)
    return {
        "record_id": record_id,
        "vin": vin,
        "vehicle_model": vehicle_model,
        "software_version": software_version,
        "engine_sha256": engine_sha256,
        "cohort": cohort,
        "recorded_at": recorded_at,
        "frames": len(confidences),
        **_latency_fields(latencies_ms),
        "confidence_histogram": confidence_histogram(confidences, settings.confidence_bins),
        "fallback_frames": fallback_frames,
        "fallback_events": onsets,
        "near_misses": int(near_misses),
        "collisions": int(collisions),
        "hard_brakes": int(hard_brakes),
        # Of the collisions, those ego caused (fleet.safety_events); a car that cannot tell
        # reports every collision as at fault.
        "at_fault_collisions": int(
            collisions if at_fault_collisions is None else at_fault_collisions
        ),
        **_optional_fields(shadow, degradation, outbox),
    }


def _fallback_totals(
    flags: Sequence[bool] | None, counts: tuple[int, int] | None
) -> tuple[int, int]:
    """(fallback frames, activations) from totals when known, else from per-frame flags."""
    if counts is not None:
        frames, onsets = (int(count) for count in counts)
        return frames, onsets
    flagged = np.asarray(flags if flags is not None else [], dtype=bool)
    onsets = int(np.sum(flagged & ~np.concatenate([[False], flagged[:-1]]))) if flagged.size else 0
    return int(flagged.sum()), onsets


def _latency_fields(latencies_ms: Sequence[float]) -> dict[str, float]:
    latencies = np.asarray(latencies_ms, dtype=float)
    percentiles = np.percentile(latencies, [50, 95, 99]) if latencies.size else np.zeros(3)
    return {
        name: round(float(value), 4)
        for name, value in zip(LATENCY_FIELDS, percentiles, strict=True)
    }


def _optional_fields(
    shadow: tuple[str, int, int] | None,
    degradation: Mapping[str, Any] | None,
    outbox: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The fields older agents do not send: shadow mode, degradation, outbox (when reported)."""
    fields: dict[str, Any] = {}
    if shadow is not None:
        fields.update(
            shadow_engine_sha256=shadow[0],
            shadow_frames=int(shadow[1]),
            shadow_agreements=int(shadow[2]),
        )
    if degradation is not None:
        fields.update(
            {name: degradation.get(name, default) for name, default in DEGRADATION_DEFAULTS.items()}
        )
    if outbox is not None:
        fields.update(outbox_fields(outbox))
    return fields


def record_from_episode(
    metrics: Any,
    *,
    vin: str,
    vehicle_model: str,
    software_version: str,
    cohort: str,
    recorded_at: str,
    record_id: str,
    outbox: Mapping[str, Any] | None = None,
    settings: TelemetrySettings | None = None,
    rules: CollisionRules | None = None,
) -> dict[str, Any]:
    """A record from one closed-loop episode (``fleet.episode_metrics.EpisodeMetrics`` or its dict).

    Latency is the per-step perception time. Collisions, at-fault collisions and near misses
    are classified by the simulation's own rules (``fleet.safety_events``): the canary and the
    regression gate count the same events. Every degradation transition goes with its offset
    from the episode's start and its cause.
    """
    settings = settings or TelemetrySettings.load()
    m = metrics.to_dict() if hasattr(metrics, "to_dict") else dict(metrics)
    events = episode_safety_events(m, rules or CollisionRules.load())
    return telemetry_record(
        record_id=record_id,
        vin=vin,
        vehicle_model=vehicle_model,
        software_version=software_version,
        engine_sha256=str(m.get("engine_sha256") or ""),
        cohort=cohort,
        recorded_at=recorded_at,
        latencies_ms=list(m.get("perception_ms") or []),
        confidences=list(m["confidence"]),
        fallback_counts=(int(m["fallback_steps"]), int(m["fallback_activations"])),
        near_misses=events["near_misses"],
        collisions=events["collisions"],
        at_fault_collisions=events["at_fault_collisions"],
        hard_brakes=int(m["hard_brakes"]),
        shadow=(
            (m["shadow_engine_sha256"], int(m["shadow_steps"]), int(m["shadow_agreements"]))
            if m.get("shadow_engine_sha256")
            else None
        ),
        degradation=_episode_degradation(m),
        outbox=outbox,
        settings=settings,
    )


def _episode_degradation(m: Mapping[str, Any]) -> dict[str, Any]:
    transitions = [
        {
            "offset_s": round(int(t["timestamp_ns"]) / 1e9, 6),
            **{name: str(t[name]) for name in TRANSITION_FIELDS[1:]},
        }
        for t in m.get("degradation_transitions") or []
    ]
    return {
        "degraded_frames": int(m.get("degraded_steps") or 0),
        "minimal_risk_frames": int(m.get("minimal_risk_steps") or 0),
        "engine_errors": int(m.get("engine_errors") or 0),
        "degradation_transitions": transitions,
    }
