"""The degradation state machine in the closed loop and in the fleet's logs.

Faults are injected the way they happen on a car: an engine object that raises (a real engine
wrapped, not a stand-in for our code), perception latency over budget and a stale camera frame
reported through :class:`SimulatedHealth`. The loop must drive on, keep the state the machine
says, record every transition with its cause, and the fleet must log them.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.fleet.closed_loop import EpisodeSetup, run_episode
from aiinfra_pipelines.fleet.conditions import Conditions
from aiinfra_pipelines.fleet.health import SimulatedHealth
from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import drive_episode_with_metrics
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine, Predictions
from aiinfra_pipelines.vehicle.degradation import (
    DEGRADED,
    DEGRADED_TIMEOUT,
    ENGINE_ERROR,
    LATENCY_OVER_BUDGET,
    MINIMAL_RISK,
    NOMINAL,
    RECOVERED,
    STALE_SENSOR,
)
from aiinfra_pipelines.vehicle.degradation_settings import DegradationSettings
from aiinfra_pipelines_tests.support.simulation_engines import brightness_onnx

pytestmark = pytest.mark.timeout(180)

SETTINGS = DegradationSettings.load()


@pytest.fixture(scope="module")
def config():
    """Light highway traffic: the episodes test the state machine, not the driving."""
    return with_overrides(
        None,
        {
            "simulation": {
                "road_types": {
                    "highway": {
                        "max_duration_s": 8,
                        "env_config": {"vehicles_count": 4, "vehicles_density": 0.6},
                    }
                }
            }
        },
    )


@pytest.fixture(scope="module")
def engine() -> OnnxRuntimeEngine:
    """Confident on daylight frames: on its own it never leaves nominal."""
    return OnnxRuntimeEngine(
        brightness_onnx(), perception_spec(), name="bright", batch_size=1, intra_op_threads=1
    )


class FaultyEngine:
    """A real engine whose calls listed in ``failing`` raise, as a crashed runtime would."""

    def __init__(self, inner: OnnxRuntimeEngine, failing: range) -> None:
        self.inner, self.failing, self.calls = inner, set(failing), 0
        self.name, self.sha256 = inner.name, inner.sha256

    def infer(self, images: np.ndarray) -> Predictions:
        call, self.calls = self.calls, self.calls + 1
        if call in self.failing:
            raise RuntimeError(f"injected engine fault on call {call}\nstack trace follows")
        return self.inner.infer(images)


def drive(config, engine, steps=40, **kwargs):
    setup = EpisodeSetup("highway", "clear", "day", env_seed=3, max_steps=steps)
    return run_episode(setup, np.random.default_rng(0), config=config, engine=engine, **kwargs)


def path(metrics) -> list[tuple[int, str, str, str]]:
    return [
        (t["step"], t["from_state"], t["to_state"], t["cause"])
        for t in metrics.degradation_transitions
    ]


def test_a_healthy_engine_and_ground_truth_stay_nominal(config, engine):
    for perceiving in (engine, None):
        metrics = drive(config, perceiving, steps=15)
        assert metrics.degradation_transitions == []
        assert (metrics.degraded_steps, metrics.minimal_risk_steps, metrics.engine_errors) == (
            0,
            0,
            0,
        )


def test_an_engine_fault_degrades_times_out_to_minimal_risk_and_recovers(config, engine):
    first_fault, clean_from = 2, 22  # 20 failing calls: 4 s, beyond the 3 s degraded timeout
    metrics = drive(config, FaultyEngine(engine, range(first_fault, clean_from)))
    timeout_steps = round(SETTINGS.degraded_timeout_s * 5)  # 5 Hz policy
    escalated = first_fault + timeout_steps
    recovered = clean_from + SETTINGS.minimal_risk_recover_after_frames - 1
    assert metrics.steps == 40 and not metrics.collision  # the loop drove on
    assert path(metrics) == [
        (first_fault, NOMINAL, DEGRADED, ENGINE_ERROR),
        (escalated, DEGRADED, MINIMAL_RISK, DEGRADED_TIMEOUT),
        (recovered, MINIMAL_RISK, NOMINAL, RECOVERED),
    ]
    entered = metrics.degradation_transitions[0]
    assert entered["timestamp_ns"] == first_fault * 200_000_000
    assert entered["detail"].startswith("RuntimeError: injected engine fault on call 2")
    assert "stack trace" not in entered["detail"]  # first line of the error only
    assert metrics.engine_errors == clean_from - first_fault
    assert metrics.degraded_steps == escalated - first_fault
    assert metrics.minimal_risk_steps == recovered - escalated
    # Outside nominal every decision is the fallback: slower, in lane.
    assert metrics.fallback_steps == recovered - first_fault
    assert metrics.decisions["SLOWER"] >= recovered - first_fault
    assert metrics.confidence[first_fault:clean_from] == [0.0] * (clean_from - first_fault)
    # Deterministic: the same faults give the same episode.
    again = drive(config, FaultyEngine(engine, range(first_fault, clean_from)))
    assert again.deterministic_dict() == metrics.deterministic_dict()


def test_a_latency_overrun_degrades_and_the_car_recovers_after_clean_frames(config, engine):
    needed = SETTINGS.enter_after_frames[LATENCY_OVER_BUDGET]
    over = SETTINGS.latency_budget_ms * 2
    overrun = {step: over for step in range(5, 5 + needed)}
    metrics = drive(config, engine, steps=20, health=SimulatedHealth(latency_ms=overrun))
    entered = 5 + needed - 1
    assert path(metrics) == [
        (entered, NOMINAL, DEGRADED, LATENCY_OVER_BUDGET),
        (entered + SETTINGS.recover_after_frames, DEGRADED, NOMINAL, RECOVERED),
    ]
    assert f"{over:.1f} ms > budget" in metrics.degradation_transitions[0]["detail"]
    assert metrics.degraded_steps == SETTINGS.recover_after_frames
    # One overrun short of the threshold is hysteresis, not degradation.
    short = {step: over for step in range(5, 5 + needed - 1)}
    brief = drive(config, engine, steps=20, health=SimulatedHealth(latency_ms=short))
    assert brief.degradation_transitions == [] and brief.fallback_steps == 0


def test_a_stale_camera_frame_degrades(config, engine):
    needed = SETTINGS.enter_after_frames[STALE_SENSOR]
    old = {step: SETTINGS.max_sensor_age_ms * 2 for step in range(3, 3 + needed)}
    metrics = drive(config, engine, steps=12, health=SimulatedHealth(sensor_age_ms=old))
    assert path(metrics)[0] == (3 + needed - 1, NOMINAL, DEGRADED, STALE_SENSOR)


def test_the_fleet_logs_every_transition_and_keeps_the_segments_around_them(config, engine):
    vehicle = build_fleet(1, config=config)[0]
    conditions = Conditions("highway", "clear", "day", vehicle.city)
    faulty = FaultyEngine(engine, range(2, 22))
    drive = drive_episode_with_metrics(vehicle, 0, 5, conditions, config, engine=faulty)
    transitions = drive.metrics.degradation_transitions
    assert [t["to_state"] for t in transitions] == [DEGRADED, MINIMAL_RISK, NOMINAL]
    logged = [event for log in drive.logs for event in log.degradation]
    assert [(e.from_state, e.to_state, e.cause) for e in logged] == [
        (t["from_state"], t["to_state"], t["cause"]) for t in transitions
    ]
    fired = [event for log in drive.logs for event in log.events if event.rule == "degradation"]
    assert [event.timestamp_ns for event in fired] == [event.timestamp_ns for event in logged]
    for log in drive.logs:
        for event in log.degradation:
            assert log.frames[0].timestamp_ns <= event.timestamp_ns <= log.frames[-1].timestamp_ns
        assert read_drive_log(encode_drive_log(log)).degradation == log.degradation


def test_a_failing_shadow_engine_disagrees_and_never_stops_the_drive(config, engine):
    """Shadow mode must not be able to hurt the car: its failures count as no agreement."""
    metrics = drive(config, engine, steps=12, shadow_engine=FaultyEngine(engine, range(3, 7)))
    assert metrics.steps == 12 and metrics.degradation_transitions == []
    assert metrics.shadow_steps == 12
    assert metrics.shadow_agreements == 12 - 4  # the four failed calls, nothing else
