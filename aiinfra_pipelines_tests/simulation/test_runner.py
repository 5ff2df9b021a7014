"""Simulating scenarios with real ONNX engines: worker-pool parity and the fallback path."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.fleet.episode_metrics import STEP_PARTS, EpisodeMetrics
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx
from aiinfra_pipelines.simulation.runner import EngineSource, SimulationJob, simulate
from aiinfra_pipelines.simulation.scenarios import build_scenario
from aiinfra_pipelines_tests.support.simulation_engines import brightness_onnx

pytestmark = pytest.mark.timeout(180)


def scenario(scenario_id: str, **fields):
    base = {"road_type": "highway", "weather": "clear", "lighting": "day", "duration_s": 2}
    return build_scenario({**base, **fields}, scenario_id=scenario_id, kind="base", family="t")


# Dense fog at night with the low beams gone too (their cone would light a brightness engine).
HEAVY = {
    "fog": {"density": 0.97, "blur_kernel_px": 5},
    "night": {"noise_sigma": 40.0, "beam_gain": 0.4},
}


@pytest.fixture(scope="module")
def engines() -> dict[str, EngineSource]:
    return {
        "brightness": EngineSource("brightness", brightness_onnx()),
        "bootstrap": EngineSource("bootstrap-0", export_onnx(bootstrap_network(perception_spec()))),
        "ground_truth": None,
    }


def deterministic(results: list[dict]) -> list[dict]:
    timing = set(EpisodeMetrics.TIMING_FIELDS)
    return [{k: v for k, v in r.items() if k not in timing} for r in results]


def test_one_and_two_worker_processes_give_identical_results(engines):
    scenarios = [
        scenario("a", traffic="dense"),
        scenario("b", weather="rain", lighting="night"),
        scenario("c", events=[{"type": "cut_in", "at_s": 0.6, "gap_m": 10.0}]),
    ]
    jobs = [SimulationJob(role, s.to_dict()) for s in scenarios for role in sorted(engines)]
    single = simulate(jobs, engines, workers=1)
    pooled = simulate(jobs, engines, workers=2)
    assert deterministic(single) == deterministic(pooled)
    assert [r["engine_name"] for r in pooled] == [
        "bootstrap-0",
        "brightness",
        "",
        "bootstrap-0",
        "brightness",
        "",
        "bootstrap-0",
        "brightness",
        "",
    ]
    # Timings are real per-step measurements: one per applied step, engine time only with one.
    for result in pooled:
        assert len(result["planner_ms"]) == result["steps"]
        assert all(t > 0 for t in result["simulator_ms"])
    with_engine = [r for r in pooled if r["perception_source"] == "engine"]
    assert all(len(r["perception_ms"]) == r["steps"] for r in with_engine)
    assert all(r["engine_sha256"] for r in with_engine)
    # The step profile times every part of a step (the oracle's "engine" is its ground-truth
    # perception; it renders no frame, so its camera part is only the timer's own overhead).
    for result in pooled:
        profile = result["step_profile_ms"]
        assert set(profile) == set(STEP_PARTS), profile
        assert all(ms >= 0.0 for ms in profile.values()), profile
        assert profile["env"] > 0.0 and profile["metrics"] > 0.0, profile
        if result["perception_source"] == "engine":
            assert profile["camera"] > 0.0, profile
        assert profile["engine"] > 0.0 and profile["planner"] > 0.0, profile


def test_heavy_degradation_makes_the_planner_fall_back_instead_of_crashing(engines):
    clear = scenario("clear")
    degraded = scenario("degraded", weather="fog", lighting="night", degradation=HEAVY)
    jobs = [
        SimulationJob("brightness", clear.to_dict()),
        SimulationJob("brightness", degraded.to_dict()),
        SimulationJob("bootstrap", degraded.to_dict()),
    ]
    on_clear, on_degraded, untrained = simulate(jobs, engines, workers=1)
    # Confident on a clear frame: no fallback.
    assert on_clear["fallback_steps"] == 0 and on_clear["min_confidence"] > 0.9
    # Nothing recognizable in dense fog at night: confidence collapses, the fallback engages on
    # every step (SLOWER, keep lane), and the episode runs to its end without a crash.
    assert on_degraded["fallback_steps"] == on_degraded["steps"] > 0
    assert on_degraded["fallback_activations"] == 1
    assert on_degraded["decisions"]["SLOWER"] == on_degraded["steps"]
    assert on_degraded["mean_confidence"] < 0.5
    assert not on_degraded["collision"]
    # The real (untrained) network falls back there too.
    assert untrained["fallback_steps"] > 0 and not untrained["collision"]
