"""The fields of a fleet telemetry record and of its published and quarantined rows.

Shared by the record's builder and publisher (``operations.telemetry``) and its validator
(``operations.telemetry_checks``), so that a field added to one cannot be missed by the other.

Landed record (JSON object or Parquet row)::

    record_id            str   unique per vehicle and window (may contain the VIN: it is
                               replaced by a keyed hash before publishing)
    vin                  str   ISO 3779, 17 characters
    vehicle_model        str
    software_version     str   what the car reports it runs (model version or planner id)
    engine_sha256        str   SHA-256 of the perception engine it ran ("" = none: ground truth)
    cohort               str   the OTA assignment it reports (operations.yaml ``cohorts``)
    recorded_at          str   ISO-8601 with UTC offset: start of the window
    frames               int   frames perceived (one per planner decision)
    latency_ms_p50/_p95/_p99  float  inference latency percentiles
    confidence_histogram list[int]  per-frame confidence counts, operations.yaml bins on [0, 1]
    fallback_frames      int   frames the planner spent in low-confidence fallback
    fallback_events      int   times it entered fallback
    near_misses, collisions, hard_brakes   int
    at_fault_collisions  int   optional: of the collisions, those ego caused (fleet.safety_events,
                               the simulation's rules); missing = every collision counts
    shadow_engine_sha256 str   optional: the engine run in shadow mode ("" = none)
    shadow_frames        int   optional: frames it perceived and planned on without acting
    shadow_agreements    int   optional: of those, frames whose shadow plan matched the driven one
    degraded_frames      int   optional: frames the degradation state machine spent in degraded
    minimal_risk_frames  int   optional: ... and in minimal_risk
    engine_errors        int   optional: frames on which the engine raised
    degradation_transitions  list  optional: every state transition, each {offset_s (seconds
                               after recorded_at), from_state, to_state, cause, detail}

    outbox_*             optional: the car's outbox at send time (operations.outbox_telemetry):
                               backlog logs/bytes, held logs, evictions, pulls served and
                               unservable, bytes sent by priority class ({class: bytes})

Published rows drop ``vin`` and gain ``vehicle_pseudonym``, ``batch_id``, ``source_commit`` and
``source_key``; ``record_id`` is replaced by its keyed hash; ``degradation_transitions`` and
``outbox_bytes_sent_by_class`` are published as JSON text (one Parquet column of any length).
"""

from __future__ import annotations

import re
from typing import Any

from .outbox_telemetry import OUTBOX_DEFAULTS

COUNT_FIELDS = ("fallback_frames", "fallback_events", "near_misses", "collisions", "hard_brakes")
LATENCY_FIELDS = ("latency_ms_p50", "latency_ms_p95", "latency_ms_p99")
TEXT_FIELDS = ("record_id", "vin", "vehicle_model", "software_version", "cohort", "recorded_at")
RECORD_FIELDS = (
    *TEXT_FIELDS,
    "engine_sha256",
    "frames",
    *LATENCY_FIELDS,
    "confidence_histogram",
    *COUNT_FIELDS,
)
# Optional fields (older agents do not send them) with the value a missing one means.
SHADOW_DEFAULTS: dict[str, Any] = {  # release.shadow.shadow_agreement summarizes them
    "shadow_engine_sha256": "",
    "shadow_frames": 0,
    "shadow_agreements": 0,
}
# The degradation state machine's figures (vehicle.degradation); optional like shadow's.
DEGRADATION_DEFAULTS: dict[str, Any] = {
    "degraded_frames": 0,
    "minimal_risk_frames": 0,
    "engine_errors": 0,
    "degradation_transitions": [],
}
# Of the collisions, those the car's classification puts on ego (fleet.safety_events). An
# older agent that does not send it has every collision counted at fault (the cautious reading).
AT_FAULT_FIELD = "at_fault_collisions"
TRANSITION_FIELDS = ("offset_s", "from_state", "to_state", "cause", "detail")
DEGRADATION_COUNTS = ("degraded_frames", "minimal_risk_frames", "engine_errors")
PUBLISHED_COLUMNS = (
    "record_id",
    "vehicle_pseudonym",
    "vehicle_model",
    "software_version",
    "engine_sha256",
    "cohort",
    "recorded_at",
    "frames",
    *LATENCY_FIELDS,
    "confidence_histogram",
    *COUNT_FIELDS,
    AT_FAULT_FIELD,
    *SHADOW_DEFAULTS,
    *DEGRADATION_DEFAULTS,
    *OUTBOX_DEFAULTS,
    "batch_id",
    "source_commit",
    "source_key",
)
QUARANTINE_COLUMNS = (
    "batch_id",
    "source_commit",
    "source_key",
    "record_index",
    "vehicle_pseudonym",
    "reason_codes",
    "reasons",
)
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
