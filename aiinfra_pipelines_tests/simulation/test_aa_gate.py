"""An A/A run: production gated against itself, through highway-env and the real configuration.

The regression gate exists to tell a worse engine from production; an engine compared with
itself must never be refused, whatever noise the seeds bring. Here the same engine is driven
twice — once in the candidate role, once in the production role, each job simulated on its
own — over the repository's own scenarios (one per family), their content-derived seeds and the
gates (gates.yaml), and the gate must certify it: the same engine drives the same seed to the
same outcome, so no pair is discordant.
"""

from __future__ import annotations

import pytest

from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.roles import ROLE_CANDIDATE, ROLE_PRODUCTION
from aiinfra_pipelines.simulation.runner import EngineSource, SimulationJob, simulate
from aiinfra_pipelines.simulation.scenarios import load_base_scenarios, scenario_seeds
from aiinfra_pipelines_tests.support.simulation_engines import perception_net_onnx

pytestmark = pytest.mark.timeout(300)


def one_per_family():
    scenarios = {}
    for scenario in load_base_scenarios():
        scenarios.setdefault(scenario.family, scenario)
    return list(scenarios.values())


def test_production_gated_against_itself_passes():
    production = EngineSource("7", perception_net_onnx(seed=7))
    engines = {ROLE_CANDIDATE: production, ROLE_PRODUCTION: production}
    scenarios = one_per_family()
    seeds = 3  # of the first stage's 12: enough to see that seeds differ, cheap to drive
    jobs = [
        SimulationJob(role, scenario.to_dict(), seed)
        for scenario in scenarios
        for seed in scenario_seeds(scenario, seeds)
        for role in (ROLE_CANDIDATE, ROLE_PRODUCTION)
    ]
    results = iter(simulate(jobs, engines, workers=1))
    rows = []
    for scenario in scenarios:
        episodes = {ROLE_CANDIDATE: [], ROLE_PRODUCTION: []}
        for _ in range(seeds):
            for role in (ROLE_CANDIDATE, ROLE_PRODUCTION):
                episodes[role].append(next(results))
        rows.append(
            {
                "scenario_id": scenario.id,
                "slice": scenario.slice,
                "kind": scenario.kind,
                "road_type": scenario.road_type,
                **episodes,
            }
        )
    result = evaluate_gate(rows, {}, None, first_release=False)  # None: the real gates.yaml
    assert result.passed, result.failures
    aggregate = result.aggregate
    assert aggregate["scenarios"] == len(scenarios) and aggregate["seeds_per_scenario"] == seeds
    assert aggregate["candidate_at_fault"] == aggregate["production_at_fault"]
    assert aggregate["candidate_passed"] == aggregate["production_passed"]
    assert all(test["worse"] == test["better"] == 0 for test in result.tests)
    for comparison in result.comparisons:
        assert comparison.candidate_verdict.pass_rate == comparison.production_verdict.pass_rate
        # Different seeds really are different episodes.
        assert len(set(comparison.candidate_verdict.seeds)) == seeds
