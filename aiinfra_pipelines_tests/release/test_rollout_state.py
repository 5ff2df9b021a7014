"""The rollout state machine on telemetry as fleet_telemetry publishes it (no Dagster)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from aiinfra_pipelines.release.rollout import (
    approve_next_stage,
    new_rollout_state,
    roll_back,
    start_rollout,
    supersede_rollout,
)
from aiinfra_pipelines.release.rollout_evaluation import evaluate_stage
from aiinfra_pipelines.release.rollout_metrics import cohort_metrics
from aiinfra_pipelines.release.rollout_settings import RolloutSettings
from aiinfra_pipelines.release.rollout_state import (
    AWAITING_APPROVAL,
    COMPLETED,
    IN_PROGRESS,
    ROLLED_BACK,
    SUPERSEDED,
    RolloutError,
    RolloutState,
)
from aiinfra_pipelines_tests.support.operations_lake import (
    fleet_vins,
    published_records,
    telemetry_records,
)

CANDIDATE = "c" * 64
PRODUCTION = "b" * 64
OTHER = "e" * 64
VINS = fleet_vins(8)
GATES = {
    "version": "gates-test",
    "release": {
        "rollout": {
            "stages": [
                {
                    "name": "canary",
                    "percent": 1,
                    "min_candidate_frames": 100,
                    "min_candidate_vehicles": 1,
                },
                {
                    "name": "early",
                    "percent": 10,
                    "min_candidate_frames": 200,
                    "min_candidate_vehicles": 2,
                },
                {"name": "full", "percent": 100},
            ],
            "min_control_frames": 200,
            "approval_required_from_percent": 100,
            "frame_rate_hz": 10,
            "exposure_cap_factor": 3,
            "events": {
                "at_fault_collisions": {
                    "column": "at_fault_collisions",
                    "margin": 2.0,
                    "harm_alpha": 0.01,
                    "noninferiority_alpha": 0.05,
                    "harm_alternatives": [1.25, 1.5, 2.0, 3.0, 4.0, 6.0],
                    "noninferiority_alternatives": [0.5, 0.75, 1.0, 1.25, 1.5],
                    "control_rate_per_1k_frames": 3.0,
                },
                "near_misses": {
                    "column": "near_misses",
                    "margin": 1.5,
                    "harm_alpha": 0.01,
                    "noninferiority_alpha": 0.05,
                    "harm_alternatives": [1.25, 1.5, 2.0, 3.0],
                    "noninferiority_alternatives": [0.67, 0.8, 1.0, 1.2],
                    "control_rate_per_1k_frames": 3.0,
                },
            },
            "budget_alpha": 0.01,
            "budgets": {
                "fallback_rate": 0.05,
                "latency_p95_ms": 10.0,
                "confidence_mean_drop": 0.1,
            },
        }
    },
}
SETTINGS = RolloutSettings.load(GATES)
PRODUCTION_POINTER = {
    "version": "1",
    "onnx_key": "candidates/1/int8.onnx",
    "engine_sha256": PRODUCTION,
    "commit": "m0",
    "model_uri": "runs:/r1/model",
}


def shadow_state(passed: bool = True) -> RolloutState:
    return new_rollout_state(
        "2",
        CANDIDATE,
        engine_key="candidates/2/int8.onnx",
        model_uri="runs:/r2/model",
        production=PRODUCTION_POINTER,
        production_engine_sha256=PRODUCTION,
        shadow={
            "passed": passed,
            "frames": 500,
            "decision_agreement": 0.9,
            "reasons": [] if passed else ["too few frames"],
        },
        at="t0",
    )


def started() -> RolloutState:
    state, decision = start_rollout(
        shadow_state(),
        SETTINGS,
        telemetry_commit="T0",
        production=PRODUCTION_POINTER,
        production_engine_sha256=PRODUCTION,
        active_rollout=None,
        at="t1",
    )
    assert decision.action == "start"
    return state


# Each cohort at 3 at-fault collisions and 3 near misses per 1,000 frames: enough exposure
# (20,000 frames a car) for the sequential tests to show an equal engine non-inferior.
CANDIDATE_EVENTS = {"collisions": 120, "near_misses": 60}
CONTROL_EVENTS = {"collisions": 360, "near_misses": 60}
FRAMES = 20_000


def fleet(
    candidate: dict | None = None, control: dict | None = None, tag: str = "w"
) -> pd.DataFrame:
    """Candidate telemetry from VINS[:2], control from VINS[2:], 20,000 frames per vehicle,
    both cohorts at the same event rates unless ``candidate``/``control`` change them."""
    records = telemetry_records(
        CANDIDATE,
        VINS[:2],
        frames=FRAMES,
        cohort="candidate",
        tag=tag,
        **{**CANDIDATE_EVENTS, **(candidate or {})},
    )
    records += telemetry_records(
        PRODUCTION, VINS[2:], frames=FRAMES, tag=tag, **{**CONTROL_EVENTS, **(control or {})}
    )
    return published_records(records, batch=f"batch-{tag}")


def test_the_configured_gates_parse_and_full_rollout_always_needs_approval():
    settings = RolloutSettings.load()
    assert settings.stages[-1].percent == 100.0
    assert settings.needs_approval(len(settings.stages) - 1)
    assert not settings.needs_approval(0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": [{"name": "a", "percent": 10}]}, "end at 100"),
        (
            {
                "stages": [
                    {"name": "a", "percent": 50},
                    {"name": "b", "percent": 10},
                    {"name": "c", "percent": 100},
                ]
            },
            "increase",
        ),
        ({"budgets": {"colisions": 1.0}}, "unknown rollout budget"),
        (
            {
                "events": {
                    "at_fault_collisions": {
                        **GATES["release"]["rollout"]["events"]["at_fault_collisions"],
                        "margin": 0.9,
                    }
                }
            },
            "margin must be a rate ratio above 1",
        ),
    ],
)
def test_bad_rollout_settings_are_refused(change, message):
    section = {**GATES["release"]["rollout"], **change}
    with pytest.raises(ValueError, match=message):
        RolloutSettings.load({"release": {"rollout": section}})


def test_shadow_must_pass_and_only_one_rollout_widens_at_a_time():
    kept, decision = start_rollout(
        shadow_state(passed=False),
        SETTINGS,
        telemetry_commit="T0",
        production=None,
        production_engine_sha256=PRODUCTION,
        active_rollout=None,
        at="t1",
    )
    assert decision.action == "none" and kept.status == "shadow"
    assert "too few frames" in decision.reason
    kept, decision = start_rollout(
        shadow_state(),
        SETTINGS,
        telemetry_commit="T0",
        production=None,
        production_engine_sha256=PRODUCTION,
        active_rollout="1",
        at="t1",
    )
    assert decision.action == "none" and "1 is active" in decision.reason
    state = started()
    assert (state.status, state.stage, state.cohort_percent) == (IN_PROGRESS, "canary", 1)
    assert state.previous_production == "1"
    assert state.previous_production_pointer == PRODUCTION_POINTER
    assert state.stage_started_telemetry_commit == "T0"


def _start_beside(active: str | None, gated_against: str | None):
    return start_rollout(
        shadow_state(),
        SETTINGS,
        telemetry_commit="T5",
        production=None,
        production_engine_sha256=PRODUCTION,
        active_rollout=active,
        gated_against=gated_against,
        at="t5",
    )


@pytest.mark.parametrize(
    ("gated_against", "why"),
    [
        (None, "gates' reference unknown"),  # reports that predate the field
        ("bootstrap-0", "gated against bootstrap-0"),  # judged before the rollout began
        ("0", "gated against 0"),  # judged against an older release
    ],
)
def test_a_candidate_not_gated_against_the_active_rollout_waits_for_it(gated_against, why):
    kept, decision = _start_beside("1", gated_against)
    assert decision.action == "none" and kept.status == "shadow"
    assert "1 is active" in decision.reason and why in decision.reason


def test_a_candidate_gated_against_the_active_rollout_supersedes_it():
    older = replace(started(), model_version="1")  # v1 at canary
    new, decision = _start_beside("1", "1")
    assert decision.action == "start" and new.status == IN_PROGRESS
    assert new.stage == "canary" and new.supersedes == "1"
    assert "supersedes the rollout of model version 1" in decision.reason
    assert new.stage_started_telemetry_commit == "T5"  # v1's telemetry never counts for v2
    gone = supersede_rollout(older, by_version="2", at="t5")
    assert (gone.status, gone.cohort_percent, gone.superseded_by) == (SUPERSEDED, 0, "2")
    assert gone.history[-1]["event"] == "superseded"
    assert gone.history[:-1] == older.history  # history kept
    assert older.status == IN_PROGRESS  # pure: the input is untouched
    # Only a newer version may take over, and only an active rollout can be superseded.
    older_kept, decision = start_rollout(
        replace(shadow_state(), model_version="0"),
        SETTINGS,
        telemetry_commit="T5",
        production=None,
        production_engine_sha256=PRODUCTION,
        active_rollout="1",
        gated_against="1",
        at="t5",
    )
    assert decision.action == "none" and older_kept.status == "shadow"
    with pytest.raises(RolloutError, match="only an active rollout"):
        supersede_rollout(gone, by_version="3", at="t6")


def test_a_healthy_stage_advances_once_and_never_twice_on_the_same_telemetry():
    state = started()
    advanced, decision = evaluate_stage(
        state, SETTINGS, telemetry_commit="T1", records=fleet(), at="t2"
    )
    assert decision.action == "advance"
    assert (advanced.stage, advanced.cohort_percent) == ("early", 10)
    assert advanced.stage_started_telemetry_commit == "T1"
    assert advanced.history[-1]["decision"]["candidate"]["frames"] == 2 * FRAMES
    tests = advanced.history[-1]["decision"]["tests"]
    assert {v["outcome"] for v in tests["events"].values()} == {"non_inferior"}
    again, repeat = evaluate_stage(
        advanced, SETTINGS, telemetry_commit="T1", records=fleet(), at="t3"
    )
    assert repeat.action == "none" and "no fresh telemetry" in repeat.reason
    assert again == advanced


def test_too_little_telemetry_waits_and_records_why():
    state = started()
    thin = published_records(
        telemetry_records(CANDIDATE, VINS[:1], frames=40)
        + telemetry_records(PRODUCTION, VINS[2:], frames=150)
    )
    waiting, decision = evaluate_stage(
        state, SETTINGS, telemetry_commit="T1", records=thin, at="t2"
    )
    assert decision.action == "wait"
    assert "candidate cohort has 40 frames (needs 100)" in decision.reason
    assert waiting.status == IN_PROGRESS and waiting.stage == "canary"
    assert waiting.last_telemetry_commit == "T1"
    assert waiting.history[-1]["event"] == "waiting"
    nothing = published_records(telemetry_records(OTHER, VINS, frames=500))
    _, decision = evaluate_stage(waiting, SETTINGS, telemetry_commit="T2", records=nothing, at="t3")
    assert decision.action == "wait" and "no telemetry from the candidate engine" in decision.reason


def test_full_rollout_waits_for_a_recorded_approval_and_never_happens_by_itself():
    state, _ = evaluate_stage(started(), SETTINGS, telemetry_commit="T1", records=fleet(), at="t2")
    state, decision = evaluate_stage(
        state, SETTINGS, telemetry_commit="T2", records=fleet(tag="w2"), at="t3"
    )
    assert decision.action == "await_approval" and state.status == AWAITING_APPROVAL
    assert state.cohort_percent == 10  # the cohort stays where it was
    held, decision = evaluate_stage(
        state, SETTINGS, telemetry_commit="T3", records=fleet(tag="w3"), at="t4"
    )
    assert decision.action == "hold" and held.status == AWAITING_APPROVAL
    with pytest.raises(RolloutError, match="approver"):
        approve_next_stage(held, SETTINGS, approver="  ", telemetry_commit="T3", at="t5")
    done, decision = approve_next_stage(
        held, SETTINGS, approver="Ada Lovelace", telemetry_commit="T3", at="t5"
    )
    assert decision.action == "complete"
    assert (done.status, done.cohort_percent) == (COMPLETED, 100)
    assert done.to_json()["approval"] == {"approver": "Ada Lovelace", "at": "t5", "stage": "full"}
    assert done.was_production
    same, decision = approve_next_stage(
        done, SETTINGS, approver="Ada Lovelace", telemetry_commit="T3", at="t6"
    )
    assert decision.action == "none" and same == done


def test_an_approval_before_the_rollout_waits_for_one_is_refused():
    with pytest.raises(RolloutError, match="only accepted while awaiting_approval"):
        approve_next_stage(started(), SETTINGS, approver="Ada", telemetry_commit="T1", at="t2")


@pytest.mark.parametrize(
    ("candidate", "metric"),
    [
        ({"fallback_share": 0.4}, "fallback_rate"),
        ({"collisions": 480}, "at_fault_collisions_per_1k_frames"),
        ({"latency_ms": 40.0}, "latency_p95_ms"),
        ({"confidence": 0.55}, "confidence_mean_drop"),
        ({"near_misses": 240}, "near_misses_per_1k_frames"),
    ],
)
def test_a_breach_rolls_back_and_records_the_evidence(candidate, metric):
    state, decision = evaluate_stage(
        started(), SETTINGS, telemetry_commit="T1", records=fleet(candidate=candidate), at="t2"
    )
    assert decision.action == "rollback"
    assert metric in [breach.metric for breach in decision.breaches]
    assert (state.status, state.cohort_percent) == (ROLLED_BACK, 0.0)
    entry = state.history[-1]
    assert entry["event"] == "rolled_back" and entry["restored_production"] == "1"
    assert entry["rolled_back_from"] == IN_PROGRESS
    assert metric in [b["metric"] for b in entry["decision"]["breaches"]]
    assert not state.was_production


def test_a_better_candidate_is_no_breach():
    better = {"fallback_share": 0.0, "confidence": 0.98, "latency_ms": 4.0}
    worse_control = {"fallback_share": 0.3, "collisions": 720, "confidence": 0.7}
    _, decision = evaluate_stage(
        started(),
        SETTINGS,
        telemetry_commit="T1",
        records=fleet(candidate=better, control=worse_control),
        at="t2",
    )
    assert decision.action == "advance" and not decision.breaches


def test_telemetry_keeps_being_watched_while_awaiting_approval():
    state, _ = evaluate_stage(started(), SETTINGS, telemetry_commit="T1", records=fleet(), at="t2")
    state, _ = evaluate_stage(
        state, SETTINGS, telemetry_commit="T2", records=fleet(tag="b"), at="t3"
    )
    assert state.status == AWAITING_APPROVAL
    state, decision = evaluate_stage(
        state,
        SETTINGS,
        telemetry_commit="T3",
        records=fleet(candidate={"collisions": 480}, tag="c"),
        at="t4",
    )
    assert decision.action == "rollback" and state.status == ROLLED_BACK
    assert state.history[-1]["rolled_back_from"] == AWAITING_APPROVAL


def test_operator_rollback_needs_a_reason_and_is_recorded():
    with pytest.raises(RolloutError, match="reason"):
        roll_back(started(), reason=" ", at="t2")
    state, decision = roll_back(started(), reason="driver complaints", at="t2", run_id="r9")
    assert decision.action == "rollback" and state.status == ROLLED_BACK
    assert state.history[-1]["reason"] == "operator rollback: driver complaints"
    assert state.history[-1]["dagster_run_id"] == "r9"
    same, decision = roll_back(state, reason="again", at="t3")
    assert decision.action == "none" and same == state


def test_cohort_metrics_aggregate_the_vehicle_records():
    records = published_records(
        telemetry_records(
            CANDIDATE,
            VINS[:1],
            frames=100,
            fallback_share=0.1,
            collisions=1,
            latency_ms=10.0,
            confidence=0.95,
        )
        + telemetry_records(CANDIDATE, VINS[1:2], frames=300, latency_ms=20.0, confidence=0.35)
    )
    metrics = cohort_metrics(records)
    assert (metrics.vehicles, metrics.records, metrics.frames) == (2, 2, 400)
    assert metrics.collision_rate_per_1k_frames == pytest.approx(2.5)
    assert metrics.fallback_rate == pytest.approx(10 / 400)
    p95 = records["latency_ms_p95"].to_numpy()
    assert metrics.latency_p95_ms == pytest.approx((p95[0] * 100 + p95[1] * 300) / 400)
    # confidences 0.95 and 0.35 land in the bins centred at 0.95 and 0.35
    assert metrics.confidence_mean == pytest.approx((0.95 * 100 + 0.35 * 300) / 400)
    assert metrics.at_fault_collisions == 1  # an agent that cannot tell: every one at fault


def test_records_of_other_engines_count_for_neither_cohort():
    mixed = pd.concat(
        [
            fleet(),
            published_records(telemetry_records(OTHER, VINS, frames=500, collisions=5, tag="x")),
        ],
        ignore_index=True,
    )
    _, decision = evaluate_stage(started(), SETTINGS, telemetry_commit="T1", records=mixed, at="t2")
    assert decision.action == "advance"
    assert decision.candidate.frames == 2 * FRAMES and decision.control.frames == 6 * FRAMES


def _first_release_state() -> RolloutState:
    """The first rollout: production is model zero on paper, the fleet drives the old stack."""
    state, decision = start_rollout(
        new_rollout_state(
            "1",
            CANDIDATE,
            engine_key="candidates/1/int8.onnx",
            model_uri="runs:/r1/model",
            production=None,
            production_engine_sha256=PRODUCTION,
            shadow={"passed": True, "frames": 500, "decision_agreement": 0.9, "reasons": []},
            at="t0",
        ),
        SETTINGS,
        telemetry_commit="T0",
        production=None,
        production_engine_sha256=PRODUCTION,
        active_rollout=None,
        at="t1",
    )
    assert decision.action == "start" and state.previous_production is None
    return state


def test_before_the_first_release_cars_without_an_engine_are_the_control_cohort():
    records = telemetry_records(
        CANDIDATE, VINS[:2], frames=FRAMES, cohort="candidate", tag="p", **CANDIDATE_EVENTS
    )
    records += telemetry_records("", VINS[2:], frames=FRAMES, tag="p", **CONTROL_EVENTS)
    _, decision = evaluate_stage(
        _first_release_state(),
        SETTINGS,
        telemetry_commit="T1",
        records=published_records(records),
        at="t2",
    )
    assert decision.action == "advance"
    assert decision.control.frames == 6 * FRAMES
    # Once an engine is in production, engine-less cars are no longer the control.
    _, later = evaluate_stage(
        started(), SETTINGS, telemetry_commit="T1", records=published_records(records), at="t2"
    )
    assert later.action == "wait" and later.control.frames == 0


# A canary-stage state exactly as the dict-based rollout code wrote it to
# release/rollout/2.json: the on-lake format RolloutState must keep reading and writing.
LEGACY_CANARY_STATE = {
    "model_version": "2",
    "engine_sha256": CANDIDATE,
    "engine_key": "candidates/2/int8.onnx",
    "model_uri": "runs:/r2/model",
    "stage_index": 0,
    "stage": "canary",
    "cohort_percent": 1.0,
    "status": "in_progress",
    "history": [
        {
            "event": "shadow",
            "at": "t0",
            "stage_index": -1,
            "stage": "shadow",
            "cohort_percent": 0.0,
            "status": "shadow",
            "reason": "shadow passed on 500 frames, decision agreement 90.0%",
            "dagster_run_id": "",
        },
        {
            "event": "stage_started",
            "at": "t1",
            "stage_index": 0,
            "stage": "canary",
            "cohort_percent": 1.0,
            "status": "in_progress",
            "reason": "shadow passed; canary cohort 1 %",
            "dagster_run_id": "",
        },
    ],
    "approval": None,
    "previous_production": "1",
    "previous_production_pointer": PRODUCTION_POINTER,
    "production_engine_sha256": PRODUCTION,
    "cohort_salt": "rollout-2-cccccccccccccccc",
    "shadow": {"passed": True, "frames": 500, "decision_agreement": 0.9, "reasons": []},
    "stage_started_telemetry_commit": "T0",
    "last_telemetry_commit": "T0",
    "supersedes": None,
}


def test_a_state_in_the_on_lake_format_loads_and_writes_back_unchanged():
    state = RolloutState.from_json(LEGACY_CANARY_STATE)
    assert (state.status, state.stage, state.cohort_percent) == (IN_PROGRESS, "canary", 1.0)
    assert state.to_json() == LEGACY_CANARY_STATE
    assert started().to_json() == LEGACY_CANARY_STATE  # what today's code writes, key for key
    completed = RolloutState.from_json(
        {**LEGACY_CANARY_STATE, "approval": {"approver": "Ada", "at": "t5", "stage": "full"}}
    )
    assert completed.to_json()["approval"] == {"approver": "Ada", "at": "t5", "stage": "full"}


def test_an_equal_engine_is_not_rolled_back_on_a_single_event_and_says_what_it_needs():
    """One at-fault collision in 200 canary frames is 5 per 1,000 against a control at 3: the
    point estimates differ, the evidence does not. The stage keeps collecting and states the
    exposure still needed (the old budget rolled back here)."""
    thin = published_records(
        telemetry_records(
            CANDIDATE, VINS[:2], frames=100, cohort="candidate", collisions=1, tag="s"
        )
        + telemetry_records(PRODUCTION, VINS[2:], frames=1000, collisions=18, tag="s"),
        batch="batch-s",
    )
    state, decision = evaluate_stage(
        started(), SETTINGS, telemetry_commit="T1", records=thin, at="t2"
    )
    assert decision.action == "wait" and state.status == IN_PROGRESS
    assert decision.reason.startswith("keep collecting: at_fault_collisions 1 in 200 frames")
    recorded = state.history[-1]["decision"]
    assert recorded["exposure_frames"] == 200
    needed = recorded["exposure_needed_frames"]
    assert needed > 1000 and f"about {needed:,} more candidate frames" in decision.reason
    assert recorded["tests"]["events"]["at_fault_collisions"]["outcome"] == "undecided"


def test_collisions_the_car_did_not_cause_are_no_safety_event():
    """Rear-ended cars: four times the control's collisions, none at fault (the simulation's
    rules, classified on the car): the at-fault test sees no harm and the stage advances."""
    rear_ended = {"collisions": 480, "at_fault_collisions": 0}
    _, decision = evaluate_stage(
        started(), SETTINGS, telemetry_commit="T1", records=fleet(candidate=rear_ended), at="t2"
    )
    assert decision.action == "advance" and not decision.breaches
    assert decision.candidate.collisions == 480 and decision.candidate.at_fault_collisions == 0
    at_fault = decision.as_dict()["tests"]["events"]["at_fault_collisions"]
    assert at_fault["outcome"] == "non_inferior" and at_fault["candidate_events"] == 0


def test_a_harmful_engine_is_rolled_back_on_evidence_not_on_one_event():
    harmful = {"collisions": 480}  # four times the control's at-fault rate over 40,000 frames
    state, decision = evaluate_stage(
        started(), SETTINGS, telemetry_commit="T1", records=fleet(candidate=harmful), at="t2"
    )
    assert decision.action == "rollback" and state.status == ROLLED_BACK
    assert decision.reason.startswith("harm shown: at_fault_collisions_per_1k_frames 12")
    events = decision.as_dict()["tests"]["events"]["at_fault_collisions"]
    assert events["outcome"] == "harm" and events["harm_e_value"] >= 1 / 0.01
