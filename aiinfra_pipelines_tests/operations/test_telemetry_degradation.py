"""Degradation state machine figures in fleet telemetry: built, checked, published."""

from __future__ import annotations

import json

import pytest

from aiinfra_pipelines.fleet.episode_metrics import EpisodeMetrics
from aiinfra_pipelines.operations.telemetry import TelemetrySettings, record_from_episode
from aiinfra_pipelines.operations.telemetry_checks import check_record
from aiinfra_pipelines.operations.telemetry_intake import validate_uploads
from aiinfra_pipelines.operations.telemetry_schema import DEGRADATION_DEFAULTS
from aiinfra_pipelines_tests.support.operations_lake import ANON_KEY, fleet_vins, telemetry_records

SETTINGS = TelemetrySettings.load()
SHA = "b" * 64
VIN = fleet_vins(1)[0]
TRANSITIONS = [
    {
        "step": 2,
        "timestamp_ns": 400_000_000,
        "from_state": "nominal",
        "to_state": "degraded",
        "cause": "engine_error",
        "detail": "RuntimeError: injected",
    },
    {
        "step": 7,
        "timestamp_ns": 1_400_000_000,
        "from_state": "degraded",
        "to_state": "nominal",
        "cause": "recovered",
        "detail": "5 clean frames",
    },
]


def episode() -> EpisodeMetrics:
    return EpisodeMetrics(
        perception_source="engine",
        engine_name="3",
        engine_sha256=SHA,
        steps=10,
        duration_s=2.0,
        collision=False,
        collision_step=None,
        min_ttc_s=None,
        min_lead_gap_m=None,
        progress_m=40.0,
        mean_speed_mps=20.0,
        hard_brakes=0,
        max_abs_jerk_mps3=0.0,
        rms_jerk_mps3=0.0,
        fallback_steps=5,
        fallback_activations=1,
        decisions={"SLOWER": 5, "IDLE": 5},
        confidence=[0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
        mean_confidence=0.81,
        min_confidence=0.0,
        events=[],
        perception_ms=[2.0] * 10,
        degradation_transitions=TRANSITIONS,
        degraded_steps=5,
        engine_errors=1,
    )


def record(**changes):
    built = record_from_episode(
        episode(),
        vin=VIN,
        vehicle_model="sedan-a",
        software_version="3",
        cohort="candidate",
        recorded_at="2024-06-03T06:00:00+00:00",
        record_id="d1",
    )
    return {**built, **changes}


def validate(records):
    return validate_uploads(
        [("telemetry/uploads/b/records.json", json.dumps(records).encode())],
        batch_id="ingest-b",
        source_commit="c" * 64,
        key=ANON_KEY,
    )


def test_an_episode_reports_every_transition_with_its_cause_and_time():
    built = record()
    assert (built["degraded_frames"], built["minimal_risk_frames"], built["engine_errors"]) == (
        5,
        0,
        1,
    )
    assert built["degradation_transitions"] == [
        {
            "offset_s": 0.4,
            "from_state": "nominal",
            "to_state": "degraded",
            "cause": "engine_error",
            "detail": "RuntimeError: injected",
        },
        {
            "offset_s": 1.4,
            "from_state": "degraded",
            "to_state": "nominal",
            "cause": "recovered",
            "detail": "5 clean frames",
        },
    ]
    assert check_record(built, SETTINGS) == []


def test_transitions_are_published_and_older_agents_get_the_defaults():
    older = telemetry_records(SHA, fleet_vins(2)[1:], frames=20, fallback_share=0.0)[0]
    assert not set(DEGRADATION_DEFAULTS) & set(older)
    batch = validate([record(), older])
    assert batch.quarantined.empty and len(batch.accepted) == 2
    reported = batch.accepted[batch.accepted["engine_errors"] == 1].iloc[0]
    assert [t["cause"] for t in json.loads(reported["degradation_transitions"])] == [
        "engine_error",
        "recovered",
    ]
    silent = batch.accepted[batch.accepted["engine_errors"] == 0].iloc[0]
    assert json.loads(silent["degradation_transitions"]) == []
    assert int(silent["degraded_frames"]) == 0


def _bad_transition(**changes):
    return record(degradation_transitions=[{**record()["degradation_transitions"][0], **changes}])


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (lambda: _bad_transition(to_state="minimal_risk"), "invalid_transition"),
        (lambda: _bad_transition(cause="gremlins"), "invalid_transition"),
        (lambda: _bad_transition(offset_s=-1.0), "invalid_transition"),
        (lambda: _bad_transition(from_state=["nominal"]), "invalid_transition"),
        (lambda: record(degradation_transitions="nominal->degraded"), "invalid_transition"),
        (lambda: record(degraded_frames=-1), "invalid_count"),
        (lambda: record(degraded_frames=8, minimal_risk_frames=8), "inconsistent_counts"),
    ],
)
def test_impossible_degradation_reports_are_quarantined(bad, code):
    batch = validate([bad()])
    assert batch.accepted.empty
    assert code in batch.quarantined["reason_codes"].iloc[0].split(",")
