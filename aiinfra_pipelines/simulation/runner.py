"""Simulating many scenarios with several engines in parallel worker processes on one machine.

Each job is (engine role, scenario, seed). Workers are *spawned* (a clean interpreter: no inherited
onnxruntime threads, highway-env class state or pygame surfaces), build their engines once from
the ONNX bytes in their initializer — one onnxruntime thread each, the processes are the
parallelism — and return plain metric dicts. Results come back in job order whatever the worker
count, and every outcome is a deterministic function of (scenario, seed, engine, configuration),
so 1 or N workers give identical results (timings aside). Every collision is classified at-fault
or not where it happens (:mod:`aiinfra_pipelines.fleet.safety_events`: the car classifies its
own collisions with the same rules), so each result carries its verdict.

The roles: the candidate, production, the oracle (ground-truth perception — the ceiling any
engine can reach with this planner) and model zero (the bootstrap engine — the floor).
"""

from __future__ import annotations

import hashlib
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.fleet.closed_loop import run_episode
from aiinfra_pipelines.fleet.safety_events import CollisionRules, fault_fields
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec

from .roles import (  # noqa: F401  (re-exported: the runner's callers name roles through it)
    GROUND_TRUTH_IDENTITY,
    ROLE_CANDIDATE,
    ROLE_MODEL_ZERO,
    ROLE_ORACLE,
    ROLE_PRODUCTION,
    ROLES,
)
from .scenarios import Scenario, episode_for
from .settings import ExecutionSettings, metrics_config, pinned_simulation_config


@dataclass(frozen=True)
class EngineSource:
    """An engine as it travels to a worker: its version name and its ONNX bytes."""

    name: str
    onnx_bytes: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.onnx_bytes).hexdigest()


def engine_identity(source: EngineSource | None) -> str:
    """What makes two roles "the same planner": the engine's sha256, or ground truth."""
    return GROUND_TRUTH_IDENTITY if source is None else source.sha256


@dataclass(frozen=True)
class SimulationJob:
    role: str
    scenario: dict[str, Any]  # Scenario.to_dict(): plain data pickles cheaply
    seed: int | None = None  # None: the scenario's own seed


_WORKER: dict[str, Any] = {}


def _init_worker(
    engines: Mapping[str, EngineSource | None],
    sim_config: dict[str, Any],
    fleet: dict[str, Any],
    spec: PerceptionSpec,
    threads: int,
) -> None:
    """Build every engine once per worker (an onnxruntime session is not picklable)."""
    from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

    _WORKER["engines"] = {
        role: None
        if source is None
        else OnnxRuntimeEngine(
            source.onnx_bytes, spec, name=source.name, batch_size=1, intra_op_threads=threads
        )
        for role, source in engines.items()
    }
    _WORKER["sim_config"] = sim_config
    _WORKER["fleet"] = fleet


def _run_job(job: SimulationJob) -> dict[str, Any]:
    engines = _WORKER["engines"]
    if job.role not in engines:
        raise KeyError(f"no engine for role {job.role!r}; have {sorted(engines)}")
    scenario = Scenario.from_dict(job.scenario)
    setup, episode_cfg, rng = episode_for(
        scenario, _WORKER["sim_config"], _WORKER["fleet"], seed=job.seed
    )
    metrics = run_episode(
        setup,
        rng,
        config=episode_cfg,
        engine=engines[job.role],
        metrics_config=metrics_config(_WORKER["sim_config"]),
    ).to_dict()
    metrics["seed"] = int(setup.env_seed)
    metrics.update(fault_fields(metrics, CollisionRules.load(_WORKER["sim_config"])))
    return metrics


def simulate(
    jobs: Sequence[SimulationJob],
    engines: Mapping[str, EngineSource | None],
    *,
    workers: int | None = None,
    sim_config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
    spec: PerceptionSpec | None = None,
    use_processes: bool | None = None,
) -> list[dict[str, Any]]:
    """Metrics for every job, in job order.

    ``engines`` maps a role to its engine (``None``: ground-truth perception). ``workers``
    defaults to simulation.yaml; with one worker the jobs run in this process unless
    ``use_processes`` forces a pool (the benchmark compares like with like).
    """
    cfg = pinned_simulation_config(sim_config)
    fleet_cfg = dict(fleet_config(fleet))
    execution = ExecutionSettings.load(cfg)
    spec = spec or perception_spec()
    count = int(workers if workers is not None else execution.workers)
    if count < 1:
        raise ValueError(f"workers must be >= 1, got {count}")
    threads = execution.onnx_intra_op_threads
    init_args = (dict(engines), cfg, fleet_cfg, spec, threads)
    if not jobs:
        return []
    in_process = use_processes is False or (use_processes is None and count == 1)
    if in_process:
        saved = dict(_WORKER)
        try:
            _init_worker(*init_args)
            return [_run_job(job) for job in jobs]
        finally:
            _WORKER.clear()
            _WORKER.update(saved)
    with ProcessPoolExecutor(
        max_workers=min(count, len(jobs)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=init_args,
    ) as pool:
        return list(pool.map(_run_job, jobs, chunksize=1))
