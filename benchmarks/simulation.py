"""Closed-loop regression simulation throughput; prints figures, asserts nothing.

The repository's base scenario library (``resources/scenarios``), each scenario driven by two
engines as ``regression_simulation`` does — the candidate (a seeded PerceptionNet exported to
ONNX) and production (model zero, the bootstrap network) — through
``aiinfra_pipelines.simulation.runner.simulate``:

1. scaling — wall time of the whole job list with a spawn pool of 1 and of 2 worker processes
   (pool start-up included, as a shard run pays it), as scenarios per minute (a scenario = both
   engines driven) and the 2-vs-1 ratio; plus 1 worker in-process (no pool) for reference;
2. per-step split — the runner's own per-step timings, summed over every step of every run:
   simulator (highway-env step + render + ground truth + degradation), engine
   (``engine.infer`` on the frame) and planner (``RulePlanner.act``), mean ms per step;
3. context — the machine's parallelism available right now (a pure-Python spin in 1 vs 2
   spawned processes, start-up excluded), the pool start-up (spawn + imports + engine
   sessions, one trivial job) and the effective parallelism of the 2-worker runs (time spent
   stepping inside workers / wall time). On a shared 2-core machine other processes take
   cores; read the scaling ratio against the available parallelism;
4. a demo-sized cycle — the base library plus ``--extra`` regression-like scenarios (base
   scenarios under new ids and seeds, as many as a 4-vehicle demo mines logs), split into 2
   shards by ``shard_of`` and simulated by two concurrent processes (as two shard runs are),
   each with 1 and with 2 workers: the wall time until both shards are done;
5. the cost of one regression report as ``regression_simulation`` runs it now: the demo-sized
   library, every scenario over the first stage of its seeds (gates.yaml
   ``simulation.evidence``: what every report drives; scenarios in doubt run more), four
   planners (candidate, production, oracle = ground truth, model zero) with one simulation per
   distinct engine — before the first release production *is* model zero, so three — in two
   concurrent shard processes with simulation.yaml's worker count, nothing cached: the wall
   time of a cold report, and the at-fault / all collision counts per planner.

Rounds are interleaved (``--repeats``); each figure is the median over rounds.

``--json`` runs section 0 alone and prints one JSON object on the last line: ``episode_s`` (CPU
seconds per episode of the candidate through the real path), ``bare_env_episode_s`` (the same
environments stepped by highway-env alone: the floor), ``overhead_ratio`` (their quotient), the
per-step split ``env_ms``, ``camera_ms``, ``truth_ms``, ``engine_ms``, ``planner_ms``,
``metrics_ms`` (the loop's own timers) and ``reused_share`` (a second report's episodes served
from the first's published outcomes); ``benchmarks/episode_cost.py`` says how each is measured.

    .venv/bin/python benchmarks/simulation.py [--repeats 2] [--scenarios 0] [--extra 16]
    .venv/bin/python benchmarks/simulation.py --report-only [--extra 16]   # section 5 only
    .venv/bin/python benchmarks/simulation.py --json [--seeds 2] [--reuse-scenarios 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import numpy as np
import torch
from episode_cost import bare_env_cost, episode_cost, profile_jobs, reuse_share

from aiinfra_pipelines.fleet.episode_metrics import STEP_PARTS
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx
from aiinfra_pipelines.simulation.gate_settings import SimulationGate
from aiinfra_pipelines.simulation.gate_verdicts import gate_section
from aiinfra_pipelines.simulation.library import shard_of
from aiinfra_pipelines.simulation.runner import (
    ROLE_CANDIDATE,
    ROLE_MODEL_ZERO,
    ROLE_ORACLE,
    ROLE_PRODUCTION,
    ROLES,
    EngineSource,
    SimulationJob,
    engine_identity,
    simulate,
)
from aiinfra_pipelines.simulation.scenarios import (
    Scenario,
    load_base_scenarios,
    scenario_seeds,
)
from aiinfra_pipelines.simulation.settings import RegressionScenarioSettings

SHARDS = 2


def demo_library(extra: int) -> list[Scenario]:
    """The base library plus ``extra`` stand-ins for mined-log scenarios (base scenarios under
    new ids and seeds, as long as simulation.yaml makes regression scenarios)."""
    base = load_base_scenarios()
    duration = RegressionScenarioSettings.load().duration_s
    copies = [
        replace(
            base[i % len(base)],
            id=f"log-{i:03d}",
            seed=base[i % len(base)].seed + 1000 + i,
            duration_s=duration,
        )
        for i in range(extra)
    ]
    return base + copies


def shard_run(shard: int, workers: int, extra: int) -> None:
    """One shard's simulation, as a shard run does it (run in its own process)."""
    sources = engines()
    scenarios = [s for s in demo_library(extra) if shard_of(s.id, SHARDS) == shard]
    jobs = [SimulationJob(role, s.to_dict()) for s in scenarios for role in sources]
    simulate(jobs, sources, workers=workers)


def concurrent_shards(workers: int, extra: int) -> float:
    """Wall seconds until both shard processes are done (their start-up included)."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--shard-run",
                str(shard),
                "--workers",
                str(workers),
                "--extra",
                str(extra),
            ]
        )
        for shard in range(SHARDS)
    ]
    for process in processes:
        if process.wait() != 0:
            raise RuntimeError(f"shard process failed: {process.args}")
    return time.perf_counter() - start


def report_shard_run(shard: int, extra: int) -> None:
    """One shard of a cold regression report, as ``run_shard`` plans it: every scenario and
    seed, the four roles, one simulation per distinct engine. Prints per-role counts as JSON."""
    sources = engines()
    roles: dict[str, EngineSource | None] = {
        ROLE_CANDIDATE: sources[ROLE_CANDIDATE],
        ROLE_PRODUCTION: sources[ROLE_PRODUCTION],  # model zero: nothing released yet
        ROLE_ORACLE: None,
        ROLE_MODEL_ZERO: sources[ROLE_PRODUCTION],
    }
    first_role = {}
    for role in ROLES:
        first_role.setdefault(engine_identity(roles[role]), role)
    scenarios = [s for s in demo_library(extra) if shard_of(s.id, SHARDS) == shard]
    jobs = [
        SimulationJob(role, s.to_dict(), seed)
        for s in scenarios
        for seed in scenario_seeds(s, first_stage_seeds())
        for role in first_role.values()
    ]
    results = simulate(jobs, roles)
    counts = {role: {"episodes": 0, "at_fault": 0, "collisions": 0, "steps": 0} for role in ROLES}
    for job, result in zip(jobs, results, strict=True):
        for role in ROLES:
            if first_role[engine_identity(roles[role])] != job.role:
                continue
            counts[role]["episodes"] += 1
            counts[role]["at_fault"] += int(result["at_fault_collision"])
            counts[role]["collisions"] += int(result["collision"])
            counts[role]["steps"] += int(result["steps"])
    print(json.dumps({"simulated": len(jobs), "counts": counts}))


def first_stage_seeds() -> int:
    """The seeds every planner drives on every scenario of a report (the first stage)."""
    return SimulationGate.from_section(gate_section()).evidence.first_stage


def regression_report_cost(extra: int) -> tuple[float, dict]:
    """Wall seconds of a cold regression report (both shards concurrently) and its counts."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, __file__, "--report-shard", str(shard), "--extra", str(extra)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for shard in range(SHARDS)
    ]
    outputs = [process.communicate()[0] for process in processes]
    wall = time.perf_counter() - start
    if any(process.returncode != 0 for process in processes):
        raise RuntimeError("a report shard process failed")
    total: dict = {"simulated": 0, "counts": {}}
    for output in outputs:
        part = json.loads(output.strip().splitlines()[-1])
        total["simulated"] += part["simulated"]
        for role, figures in part["counts"].items():
            into = total["counts"].setdefault(role, dict.fromkeys(figures, 0))
            for name, value in figures.items():
                into[name] += value
    return wall, total


def print_report_cost(extra: int, repeats: int) -> None:
    count = len(demo_library(extra))
    seeds = first_stage_seeds()
    print(
        f"\nregression report: {count} scenarios x {seeds} seeds x 4 planners "
        f"(production = model zero: 3 simulated), {SHARDS} concurrent shard runs, cold cache"
    )
    walls = []
    for _ in range(repeats):
        wall, total = regression_report_cost(extra)
        walls.append(wall)
    print(
        f"  wall per report: {statistics.median(walls):6.2f} s (median of {repeats}; "
        f"{total['simulated']} episodes simulated)"
    )
    for role, figures in total["counts"].items():
        print(
            f"  {role:11s} at-fault {figures['at_fault']:3d}   all collisions "
            f"{figures['collisions']:3d}   of {figures['episodes']} episodes"
        )


def print_episode_cost(first: int, seeds: int, reports_on: int) -> None:
    """Section 0: an episode against its floor, the per-step split and a second report's reuse
    (benchmarks/episode_cost.py says how each is measured); one JSON object, last line."""
    scenarios = load_base_scenarios()
    scenarios = scenarios[:first] if first else scenarios
    sources = engines()
    jobs = profile_jobs(scenarios, seeds)
    print(f"episode cost: {len(scenarios)} scenarios x {seeds} seeds, the candidate engine")
    real = episode_cost(jobs, sources[ROLE_CANDIDATE])
    bare = bare_env_cost(jobs, real.pop("steps_by_job"))
    torch.manual_seed(2)
    second = EngineSource("candidate-2", export_onnx(PerceptionNet(perception_spec()).eval()))
    library = load_base_scenarios()[:reports_on]
    print(f"two reports: {len(library)} scenarios, the evidence plan of gates.yaml")
    reuse = reuse_share(library, sources[ROLE_CANDIDATE], second, sources[ROLE_PRODUCTION])
    figures = {
        **real,
        **bare,
        "overhead_ratio": round(real["episode_s"] / bare["bare_env_episode_s"], 2),
        **reuse,
        "cpus": os.cpu_count(),
    }
    parts = "  ".join(f"{p} {real[f'{p}_ms']:.2f}" for p in STEP_PARTS)
    print(
        f"  episode {real['episode_s']:.3f} s CPU vs bare env {bare['bare_env_episode_s']:.3f} s:"
        f" overhead x{figures['overhead_ratio']:.2f}; per step ms: {parts}"
    )
    print(f"  second report served {reuse['reused_share']:.1%} of its episodes from the cache")
    print(json.dumps(figures))


def engines() -> dict[str, EngineSource]:
    spec = perception_spec()
    torch.manual_seed(1)
    candidate = export_onnx(PerceptionNet(spec).eval())
    return {
        ROLE_CANDIDATE: EngineSource("candidate", candidate),
        ROLE_PRODUCTION: EngineSource("bootstrap-0", export_onnx(bootstrap_network(spec))),
    }


def _spin(seconds_of_work: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(seconds_of_work * 12_000_000):
        total += i
    return time.perf_counter() - start


def available_parallelism(work: int = 1) -> float:
    """Speed-up of 2 spawned processes over 1 on a fixed CPU-bound loop (start-up excluded)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        list(pool.map(_spin, [0, 0]))  # start both workers first
        start = time.perf_counter()
        list(pool.map(_spin, [work]))
        one = time.perf_counter() - start
        start = time.perf_counter()
        list(pool.map(_spin, [work, work]))
        two = time.perf_counter() - start
    return 2 * one / two


def timed(run) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    results = run()
    return time.perf_counter() - start, results


def ran_one_section(args: argparse.Namespace) -> bool:
    """Run the one section (or shard helper) the arguments ask for; whether one was asked."""
    if args.shard_run is not None:
        shard_run(args.shard_run, args.workers, args.extra)
    elif args.report_shard is not None:
        report_shard_run(args.report_shard, args.extra)
    elif args.report_only:
        print_report_cost(args.extra, args.repeats)
    elif args.json:
        print_episode_cost(args.scenarios, args.seeds, args.reuse_scenarios)
    else:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scenarios", type=int, default=0, help="first N scenarios (0 = all)")
    parser.add_argument("--extra", type=int, default=16, help="regression-like scenarios (4)")
    parser.add_argument("--shard-run", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--report-shard", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true", help="section 5 only")
    parser.add_argument(
        "--json", action="store_true", help="section 0 only: one JSON object on the last line"
    )
    parser.add_argument("--seeds", type=int, default=2, help="seeds per scenario in section 0")
    parser.add_argument(
        "--reuse-scenarios", type=int, default=4, help="scenarios of section 0's two reports"
    )
    args = parser.parse_args()
    if ran_one_section(args):
        return

    scenarios = load_base_scenarios()
    if args.scenarios:
        scenarios = scenarios[: args.scenarios]
    sources = engines()
    jobs = [SimulationJob(role, s.to_dict()) for s in scenarios for role in sources]
    steps = sum(round(s.duration_s * 5) for s in scenarios)
    print(
        f"{len(scenarios)} scenarios x {len(sources)} engines = {len(jobs)} episodes "
        f"(<= {steps * len(sources)} policy steps), {os.cpu_count()} CPUs"
    )

    modes = {
        "in-process, 1 worker": {"workers": 1, "use_processes": False},
        "spawn pool, 1 worker": {"workers": 1, "use_processes": True},
        "spawn pool, 2 workers": {"workers": 2, "use_processes": True},
    }
    walls: dict[str, list[float]] = {name: [] for name in modes}
    results: list[dict] = []
    for _ in range(args.repeats):
        for name, options in modes.items():
            wall, results = timed(lambda options=options: simulate(jobs, sources, **options))
            walls[name].append(wall)

    print("\nscaling (median over rounds)")
    per_minute = {}
    for name, values in walls.items():
        wall = statistics.median(values)
        per_minute[name] = len(scenarios) / wall * 60.0
        print(f"  {name:24s} {wall:7.2f} s   {per_minute[name]:7.1f} scenarios/min")
    ratio = per_minute["spawn pool, 2 workers"] / per_minute["spawn pool, 1 worker"]
    print(f"  scaling 2 vs 1 worker processes: {ratio:.2f}x")
    busy = sum(
        sum(r["simulator_ms"]) + sum(r["perception_ms"]) + sum(r["planner_ms"]) for r in results
    )
    print(
        f"  effective parallelism of the last 2-worker round: "
        f"{busy / 1e3 / walls['spawn pool, 2 workers'][-1]:.2f} (time stepping / wall)"
    )
    startup, _ = timed(lambda: simulate(jobs[:1], sources, workers=1, use_processes=True))
    print(f"  pool start-up + one episode: {startup:.2f} s")
    one = statistics.median(walls["spawn pool, 1 worker"]) - startup
    two = statistics.median(walls["spawn pool, 2 workers"]) - startup
    print(f"  scaling 2 vs 1 without the start-up: {one / two:.2f}x")
    print(f"  machine parallelism available now: {available_parallelism():.2f}x (2 procs vs 1)")

    print("\nper simulated step (all runs of the last 2-worker round)")
    series = {
        "simulator": np.concatenate([r["simulator_ms"] for r in results]),
        "engine": np.concatenate([r["perception_ms"] for r in results]),
        "planner": np.concatenate([r["planner_ms"] for r in results]),
    }
    applied = sum(r["steps"] for r in results)
    total = sum(float(v.sum()) for v in series.values())
    for name, values in series.items():
        share = float(values.sum()) / total * 100.0
        print(
            f"  {name:9s} mean {float(values.sum()) / applied:6.2f} ms/step   "
            f"p95 {np.percentile(values, 95):6.2f} ms   {share:5.1f} %"
        )
    print(f"  total     mean {total / applied:6.2f} ms/step over {applied} steps")

    count = len(demo_library(args.extra))
    print(f"\ndemo-sized cycle: {count} scenarios x 2 engines in {SHARDS} concurrent shard runs")
    for workers in (1, 2):
        walls_shards = [concurrent_shards(workers, args.extra) for _ in range(args.repeats)]
        print(
            f"  {workers} worker(s) per shard: {statistics.median(walls_shards):6.2f} s "
            "until every shard is done"
        )
    print_report_cost(args.extra, args.repeats)


if __name__ == "__main__":
    main()
