"""Where one closed-loop episode's time goes, against its floor; imported by simulation.py.

Three measurements, each on the same scenarios and seeds:

- ``episode_cost`` — CPU seconds per episode of one engine through the real path
  (``simulation.runner.simulate`` in this process: simulator, camera, ground truth, inference,
  planner, metrics), and the loop's own per-step split (``EpisodeMetrics.step_profile_ms``);
- ``bare_env_cost`` — the floor: the same environments (scenario overrides, seeds) stepped by
  highway-env alone for as many steps as the real episode took, the ego on its own controller
  (the IDLE meta-action: keep lane, keep speed), other traffic on its driver model. No camera,
  no inference, no ground truth, no metrics;
- ``reuse_share`` — a second regression report through the real evidence plan
  (``collect_evidence`` over an ``EpisodeStore`` on a LocalLake): the first report publishes its
  outcomes, the second (a new candidate, the first candidate now production) reads what it can
  from that cache. The share is the episodes served from the cache over all it needed.

CPU seconds come from ``time.process_time`` (all threads of this process), so other work on
the machine slows the wall clock but not the figures.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from typing import Any

from aiinfra_pipelines.fleet.episode_metrics import STEP_PARTS
from aiinfra_pipelines.fleet.settings import fleet_config
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION
from aiinfra_pipelines.simulation.evidence import collect_evidence
from aiinfra_pipelines.simulation.gate_settings import SimulationGate
from aiinfra_pipelines.simulation.gate_verdicts import gate_section
from aiinfra_pipelines.simulation.library import records_by_id
from aiinfra_pipelines.simulation.runner import (
    ROLE_CANDIDATE,
    ROLE_MODEL_ZERO,
    ROLE_ORACLE,
    ROLE_PRODUCTION,
    EngineSource,
    SimulationJob,
    simulate,
)
from aiinfra_pipelines.simulation.scenarios import Scenario, episode_for, scenario_seeds
from aiinfra_pipelines.simulation.settings import pinned_simulation_config, simulator_fingerprint
from aiinfra_pipelines.simulation.shard import EpisodeStore


def profile_jobs(scenarios: Sequence[Scenario], seeds: int) -> list[SimulationJob]:
    """The candidate on each scenario's first ``seeds`` seeds (the seeds a report drives)."""
    return [
        SimulationJob(ROLE_CANDIDATE, s.to_dict(), seed)
        for s in scenarios
        for seed in scenario_seeds(s, seeds)
    ]


def episode_cost(jobs: list[SimulationJob], candidate: EngineSource) -> dict[str, Any]:
    """CPU seconds per episode through the real path, and the per-step split of its parts."""
    simulate(jobs[:1], {ROLE_CANDIDATE: candidate}, workers=1)  # imports, session, first env
    started = time.process_time()
    results = simulate(jobs, {ROLE_CANDIDATE: candidate}, workers=1)
    cpu_s = time.process_time() - started
    steps = sum(int(r["steps"]) for r in results)
    split = {
        f"{part}_ms": round(sum(r["step_profile_ms"][part] for r in results) / steps, 3)
        for part in STEP_PARTS
    }
    return {
        "episodes": len(results),
        "steps": steps,
        "episode_s": round(cpu_s / len(results), 4),
        "step_ms": round(cpu_s * 1e3 / steps, 3),
        **split,
        "steps_by_job": [int(r["steps"]) for r in results],
    }


def bare_env_cost(jobs: list[SimulationJob], steps_by_job: Sequence[int]) -> dict[str, Any]:
    """CPU seconds per episode of highway-env alone on the same environments and step counts."""
    from aiinfra_pipelines.fleet.sim_env import isolated_behaviour_class, make_env

    cfg = pinned_simulation_config(None)
    fleet = dict(fleet_config(None))
    cpu_s = 0.0
    for job, steps in zip(jobs, steps_by_job, strict=True):
        setup, episode_cfg, _ = episode_for(Scenario.from_dict(job.scenario), cfg, fleet, job.seed)
        with isolated_behaviour_class(episode_cfg):
            started = time.process_time()
            env = make_env(setup.road_type, setup.env_seed, episode_cfg)
            try:
                idle = env.unwrapped.action_type.actions_indexes["IDLE"]
                for _ in range(steps):
                    env.step(idle)
            finally:
                env.close()
            cpu_s += time.process_time() - started
    return {"bare_env_episode_s": round(cpu_s / len(jobs), 4)}


def reuse_share(
    scenarios: Sequence[Scenario],
    first: EngineSource,
    second: EngineSource,
    model_zero: EngineSource,
) -> dict[str, Any]:
    """A second report's episodes served from the first report's published outcomes."""
    cfg = pinned_simulation_config(None)
    section = gate_section()
    plan = SimulationGate.from_section(section).evidence
    records = records_by_id({"scenarios": [s.to_dict() for s in scenarios]})
    fingerprint = simulator_fingerprint(cfg, None)
    with tempfile.TemporaryDirectory(prefix="episode-cost-") as root:
        lake = LocalLake(root=root)
        lake.ensure_repository()
        reports = []
        for number, (candidate, production) in enumerate(
            [(first, model_zero), (second, first)], start=1
        ):
            store = EpisodeStore(
                lake,
                {
                    ROLE_CANDIDATE: candidate,
                    ROLE_PRODUCTION: production,
                    ROLE_ORACLE: None,
                    ROLE_MODEL_ZERO: model_zero,
                },
                {},
                fingerprint,
                run=lambda jobs, engines: simulate(jobs, engines, sim_config=cfg),
            )
            started = time.perf_counter()
            collect_evidence(
                scenarios,
                plan,
                store,
                records=records,
                gates=section,
                production_version=production.name,
                first_release=production.name == BOOTSTRAP_VERSION,
            )
            reports.append(
                {
                    "simulated": store.simulated,
                    "reused": len(store.cached),
                    "wall_s": round(time.perf_counter() - started, 2),
                }
            )
            publish_objects(
                lake, f"bench-{number}", store.cache_objects, "outcomes", {"report": str(number)}
            )
    second_report = reports[1]
    needed = second_report["simulated"] + second_report["reused"]
    return {
        "reused_share": round(second_report["reused"] / needed, 4) if needed else None,
        "reports": reports,
    }
