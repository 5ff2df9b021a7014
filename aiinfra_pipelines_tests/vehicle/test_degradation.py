"""The car's degradation state machine: every cause, hysteresis, the timeout, recovery."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.vehicle.degradation import (
    ALLOWED_TRANSITIONS,
    DEGRADED,
    DEGRADED_TIMEOUT,
    ENGINE_ERROR,
    FAULT_CAUSES,
    LATENCY_OVER_BUDGET,
    LOW_CONFIDENCE,
    MINIMAL_RISK,
    NOMINAL,
    RECOVERED,
    STALE_SENSOR,
    DegradationMonitor,
    FrameHealth,
)
from aiinfra_pipelines.vehicle.degradation_settings import DegradationSettings

PERIOD_NS = 200_000_000  # 5 Hz
SETTINGS = DegradationSettings.load()


def healthy(step: int, **changes) -> FrameHealth:
    """A frame judged at ``step`` that is clean unless ``changes`` make it faulty."""
    now = step * PERIOD_NS
    base = {
        "timestamp_ns": now,
        "confidence": 0.9,
        "latency_ms": 5.0,
        "sensor_timestamp_ns": now,
    }
    return FrameHealth(**{**base, **changes})


FAULTY = {
    ENGINE_ERROR: {"confidence": None, "engine_error": "RuntimeError: kernel failed"},
    STALE_SENSOR: {"sensor_timestamp_ns": -10 * PERIOD_NS},  # made relative in bad()
    LATENCY_OVER_BUDGET: {"latency_ms": SETTINGS.latency_budget_ms + 1.0},
    LOW_CONFIDENCE: {"confidence": SETTINGS.min_confidence - 0.01},
}


def bad(step: int, cause: str) -> FrameHealth:
    changes = dict(FAULTY[cause])
    if cause == STALE_SENSOR:
        age_ns = round((SETTINGS.max_sensor_age_ms + 1.0) * 1e6)
        changes["sensor_timestamp_ns"] = step * PERIOD_NS - age_ns
    return healthy(step, **changes)


def test_the_repository_settings_load_and_share_the_planners_confidence_floor():
    assert set(SETTINGS.enter_after_frames) == set(FAULT_CAUSES)
    fleet = load_resource_yaml("fleet.yaml")
    assert SETTINGS.min_confidence == float(fleet["planner"]["min_confidence"])
    assert SETTINGS.minimal_risk_recover_after_frames > SETTINGS.recover_after_frames


@pytest.mark.parametrize("cause", FAULT_CAUSES)
def test_every_cause_enters_degraded_after_its_consecutive_frames(cause):
    monitor = DegradationMonitor(SETTINGS)
    needed = SETTINGS.enter_after_frames[cause]
    for step in range(needed - 1):
        status = monitor.update(bad(step, cause))
        assert status.state == NOMINAL and status.faults == (cause,)
    status = monitor.update(bad(needed - 1, cause))
    assert status.state == DEGRADED and status.cause == cause
    transition = status.transition
    assert transition is not None and monitor.transitions == [transition]
    assert (transition.from_state, transition.to_state, transition.cause) == (
        NOMINAL,
        DEGRADED,
        cause,
    )
    assert transition.timestamp_ns == (needed - 1) * PERIOD_NS and transition.detail


@pytest.mark.parametrize(
    "cause", [c for c in FAULT_CAUSES if DegradationSettings.load().enter_after_frames[c] > 1]
)
def test_an_interrupted_streak_does_not_enter_degraded(cause):
    """Hysteresis on the way in: isolated faulty frames, each followed by a clean one."""
    monitor = DegradationMonitor(SETTINGS)
    needed = SETTINGS.enter_after_frames[cause]
    step = 0
    for _ in range(5):
        for _ in range(needed - 1):
            assert monitor.update(bad(step, cause)).state == NOMINAL
            step += 1
        assert monitor.update(healthy(step)).state == NOMINAL
        step += 1
    assert monitor.transitions == []


def test_unmeasured_latency_and_sensor_time_are_not_faults():
    monitor = DegradationMonitor(SETTINGS)
    for step in range(20):
        status = monitor.update(
            FrameHealth(step * PERIOD_NS, 0.9, latency_ms=None, sensor_timestamp_ns=None)
        )
        assert status.faults == ()
    assert monitor.state == NOMINAL


def test_recovery_from_degraded_needs_consecutive_clean_frames():
    monitor = DegradationMonitor(SETTINGS)
    monitor.update(bad(0, ENGINE_ERROR))
    assert monitor.state == DEGRADED
    step = 1
    # One clean frame short of recovery, then a fault: the count starts over.
    for _ in range(SETTINGS.recover_after_frames - 1):
        assert monitor.update(healthy(step)).state == DEGRADED
        step += 1
    assert monitor.update(bad(step, LOW_CONFIDENCE)).state == DEGRADED
    step += 1
    for _ in range(SETTINGS.recover_after_frames - 1):
        assert monitor.update(healthy(step)).state == DEGRADED
        step += 1
    status = monitor.update(healthy(step))
    assert status.state == NOMINAL and status.cause == ""
    assert status.transition is not None
    assert (status.transition.from_state, status.transition.cause) == (DEGRADED, RECOVERED)


def test_a_persisting_fault_times_out_into_minimal_risk_which_recovers_only_slowly():
    monitor = DegradationMonitor(SETTINGS)
    timeout_steps = round(SETTINGS.degraded_timeout_s * 1e9 / PERIOD_NS)
    step = 0
    # A latency fault that comes and goes: never recovers, so the timeout must end it.
    while monitor.state != MINIMAL_RISK:
        cause_frame = step % 2 == 0 or step < SETTINGS.enter_after_frames[LATENCY_OVER_BUDGET]
        monitor.update(bad(step, LATENCY_OVER_BUDGET) if cause_frame else healthy(step))
        step += 1
        assert step < 100
    entered, escalated = monitor.transitions
    assert (entered.to_state, entered.cause) == (DEGRADED, LATENCY_OVER_BUDGET)
    assert (escalated.from_state, escalated.to_state, escalated.cause) == (
        DEGRADED,
        MINIMAL_RISK,
        DEGRADED_TIMEOUT,
    )
    assert (escalated.timestamp_ns - entered.timestamp_ns) >= timeout_steps * PERIOD_NS
    assert monitor.cause == LATENCY_OVER_BUDGET  # the fault that started it is still named
    # The degraded recovery period is not enough to leave minimal risk; the longer one is.
    for _ in range(SETTINGS.recover_after_frames):
        assert monitor.update(healthy(step)).state == MINIMAL_RISK
        step += 1
    for _ in range(SETTINGS.minimal_risk_recover_after_frames - SETTINGS.recover_after_frames - 1):
        assert monitor.update(healthy(step)).state == MINIMAL_RISK
        step += 1
    status = monitor.update(healthy(step))
    assert status.state == NOMINAL
    assert [(t.from_state, t.to_state) for t in monitor.transitions] == [
        (NOMINAL, DEGRADED),
        (DEGRADED, MINIMAL_RISK),
        (MINIMAL_RISK, NOMINAL),
    ]
    assert all((t.from_state, t.to_state) in ALLOWED_TRANSITIONS for t in monitor.transitions)


def test_a_degraded_car_that_is_recovering_at_the_timeout_is_not_escalated():
    monitor = DegradationMonitor(
        dataclasses.replace(SETTINGS, degraded_timeout_s=0.2, recover_after_frames=3)
    )
    monitor.update(bad(0, ENGINE_ERROR))
    for step in range(1, 4):
        monitor.update(healthy(step))
    assert monitor.state == NOMINAL
    assert [t.to_state for t in monitor.transitions] == [DEGRADED, NOMINAL]


def test_several_causes_on_one_frame_name_the_most_severe():
    monitor = DegradationMonitor(
        dataclasses.replace(SETTINGS, enter_after_frames=dict.fromkeys(FAULT_CAUSES, 1))
    )
    status = monitor.update(
        healthy(0, confidence=0.1, latency_ms=1e3, sensor_timestamp_ns=-(10**9))
    )
    assert status.faults == (STALE_SENSOR, LATENCY_OVER_BUDGET, LOW_CONFIDENCE)
    assert status.cause == STALE_SENSOR


def test_time_may_not_go_backwards_and_reset_forgets_everything():
    monitor = DegradationMonitor(SETTINGS)
    monitor.update(bad(5, ENGINE_ERROR))
    with pytest.raises(ValueError, match="backwards"):
        monitor.update(healthy(4))
    monitor.reset()
    assert (monitor.state, monitor.cause, monitor.transitions) == (NOMINAL, "", [])
    assert monitor.update(healthy(0)).state == NOMINAL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"minimal_risk_recover_after_frames": 5}, "longer than"),
        ({"recover_after_frames": 0}, "recover_after_frames"),
        ({"latency_budget_ms": 0}, "latency_budget_ms"),
        ({"min_confidence": 1.5}, "min_confidence"),
        ({"enter_after_frames": {"engine_error": 1}}, "exactly the causes"),
        ({"enter_after_frames": {**dict.fromkeys(FAULT_CAUSES, 1), "engine_error": 0}}, ">= 1"),
    ],
)
def test_settings_that_cannot_define_the_machine_are_refused(change, message):
    config = yaml.safe_load(yaml.safe_dump(load_resource_yaml("vehicle.yaml")))
    config["degradation"].update(change)
    with pytest.raises(ValueError, match=message):
        DegradationSettings.load(config)
