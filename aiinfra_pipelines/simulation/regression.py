"""Regression simulation as plain functions: simulate one shard, aggregate shards into a report.

:func:`run_shard` runs the candidate's ship engine and the production engine on every scenario
of one shard (cached per-engine outcomes reused) and returns the shard's record plus the new
cache objects; :func:`aggregate_shards` refuses shards that were simulated for different
candidates, engines, library versions or simulator settings, and :func:`build_report` turns the
gate's verdict into the report certification reads (top-level ``passed`` and
``model_version``, one row per scenario with the metrics the gate used).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.fleet.settings import FleetConfig
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH

from .candidate import load_candidate, load_production
from .gate import GateResult, ScenarioComparison
from .library import LIBRARY_KEY, scenarios_of_shard
from .results import cached_metrics, outcome_record, result_key, shard_result_key
from .runner import ROLE_CANDIDATE, ROLE_PRODUCTION, EngineSource, SimulationJob, simulate
from .scenarios import Scenario
from .settings import shard_count, simulation_config, simulator_fingerprint

REPORT_FORMAT = 1
# The shard fields that must agree before shards may be aggregated into one report.
SHARD_IDENTITY = (
    "model_version",
    "candidate_engine_sha256",
    "production_version",
    "production_engine_sha256",
    "library_version",
    "simulator_fingerprint",
)
# Metrics the report keeps per engine and scenario (the gate needs the first six).
REPORT_METRICS = (
    "collision",
    "collision_step",
    "min_ttc_s",
    "hard_brakes",
    "progress_m",
    "duration_s",
    "min_lead_gap_m",
    "max_abs_jerk_mps3",
    "rms_jerk_mps3",
    "fallback_activations",
    "fallback_steps",
    "mean_confidence",
    "min_confidence",
    "steps",
)


class RegressionError(ValueError):
    """Shards cannot be aggregated (missing, or simulated for different candidates)."""


@dataclass
class ShardRun:
    record: dict[str, Any]
    cache_objects: dict[str, bytes] = field(default_factory=dict)

    @property
    def simulated(self) -> int:
        return int(self.record["simulated_runs"])

    @property
    def reused(self) -> int:
        return int(self.record["reused_runs"])


def read_library(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict[str, Any]:
    if not lake.object_exists(ref, LIBRARY_KEY):
        raise RegressionError(
            f"no scenario library: {LIBRARY_KEY} is not on {ref} (materialize scenario_library)"
        )
    return lake.get_json(ref, LIBRARY_KEY)


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=str).encode()


def run_shard(
    lake: VersionedLake,
    shard_key: str,
    *,
    shards: int | None = None,
    model_version: str | None = None,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
    workers: int | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> ShardRun:
    """Simulate the candidate and production on every scenario of ``shard_key`` (one of
    ``shards`` shards, default simulation.yaml's count)."""
    cfg = simulation_config(config)
    shards = shards or shard_count(cfg)
    library = read_library(lake)
    candidate = load_candidate(lake, model_version)
    production = load_production(lake)
    scenarios = scenarios_of_shard(library, shard_key, shards)
    fingerprint = simulator_fingerprint(cfg, fleet)
    engines = {ROLE_CANDIDATE: candidate.engine, ROLE_PRODUCTION: production}

    metrics: dict[tuple[str, str], dict[str, Any]] = {}  # (engine sha, scenario id) -> metrics
    cached: set[tuple[str, str]] = set()
    jobs: list[SimulationJob] = []
    job_keys: list[tuple[str, str]] = []
    for scenario in scenarios:
        for role, source in engines.items():
            key = (source.sha256, scenario.id)
            if key in metrics or key in job_keys:
                continue  # candidate == production: simulate once
            hit = cached_metrics(lake, MAIN_BRANCH, source.sha256, scenario, fingerprint)
            if hit is not None:
                metrics[key] = hit
                cached.add(key)
            else:
                jobs.append(SimulationJob(role, scenario.to_dict()))
                job_keys.append(key)
    if on_progress is not None:
        on_progress(
            f"{shard_key}: {len(scenarios)} scenario(s), {len(jobs)} run(s) to simulate, "
            f"{len(cached)} reused from the cache"
        )
    results = simulate(jobs, engines, workers=workers, sim_config=cfg, fleet=fleet)
    by_id = {scenario.id: scenario for scenario in scenarios}
    cache_objects = {}
    for (sha, scenario_id), job, result in zip(job_keys, jobs, results, strict=True):
        metrics[(sha, scenario_id)] = result
        scenario = by_id[scenario_id]
        source = engines[job.role]
        record = outcome_record(source.name, sha, scenario, fingerprint, result)
        cache_objects[result_key(sha, scenario)] = _json(record)
    rows = [_shard_row(scenario, engines, metrics, cached) for scenario in scenarios]
    record = {
        "format": REPORT_FORMAT,
        "shard": shard_key,
        "shards": shards,
        "model_version": candidate.model_version,
        "candidate_engine_sha256": candidate.engine.sha256,
        "production_version": production.name,
        "production_engine_sha256": production.sha256,
        "library_version": int(library["library_version"]),
        "library_scenarios": len(library["scenarios"]),
        "simulator_fingerprint": fingerprint,
        "simulated_runs": len(jobs),
        "reused_runs": len(cached),
        "scenarios": rows,
    }
    return ShardRun(record=record, cache_objects=cache_objects)


def _shard_row(
    scenario: Scenario,
    engines: Mapping[str, EngineSource],
    metrics: Mapping[tuple[str, str], dict[str, Any]],
    cached: set[tuple[str, str]],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "scenario_id": scenario.id,
        "scenario_version": scenario.version,
        "slice": scenario.slice,
        "kind": scenario.kind,
        "road_type": scenario.road_type,
        "cached": {},
    }
    for role, source in engines.items():
        key = (source.sha256, scenario.id)
        row[role] = metrics[key]
        row["cached"][role] = key in cached
    return row


def shard_objects(run: ShardRun) -> dict[str, bytes]:
    """Everything a shard publishes: its record and the outcomes it newly simulated."""
    return {shard_result_key(run.record["shard"]): _json(run.record), **run.cache_objects}


# ------------------------------------------------------------------------------ aggregation
def read_shards(
    lake: VersionedLake, keys: Sequence[str], ref: str = MAIN_BRANCH
) -> dict[str, dict[str, Any] | None]:
    """Every shard's latest record on ``ref`` (``None`` where a shard never ran)."""
    return {
        key: lake.get_json(ref, shard_result_key(key))
        if lake.object_exists(ref, shard_result_key(key))
        else None
        for key in keys
    }


def aggregate_shards(
    shard_records: Mapping[str, Mapping[str, Any] | None],
    *,
    model_version: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the shards' shared identity, every scenario row) — or :class:`RegressionError`.

    Refuses missing shards, shards simulated for different candidates / engines / library
    versions / simulator settings, a requested ``model_version`` other than the shards', and
    shards that do not cover the library exactly once.
    """
    missing = sorted(key for key, record in shard_records.items() if record is None)
    if missing:
        raise RegressionError(f"shard(s) not simulated yet: {missing}")
    records = {key: record for key, record in shard_records.items() if record is not None}
    identities = {
        key: {f: record.get(f) for f in SHARD_IDENTITY} for key, record in records.items()
    }
    distinct = {json.dumps(identity, sort_keys=True) for identity in identities.values()}
    if len(distinct) > 1:
        differing = [
            f
            for f in SHARD_IDENTITY
            if len({json.dumps(identity[f]) for identity in identities.values()}) > 1
        ]
        detail = "; ".join(
            f"{key}: " + ", ".join(f"{f}={identities[key][f]}" for f in differing)
            for key in sorted(identities)
        )
        raise RegressionError(
            f"refusing to aggregate shards simulated for different candidates or settings "
            f"(differing: {', '.join(differing)}) — {detail}. Re-run the stale shards."
        )
    identity = next(iter(identities.values()))
    if model_version is not None and str(identity["model_version"]) != str(model_version):
        raise RegressionError(
            f"shards were simulated for model version {identity['model_version']}, "
            f"the report was requested for {model_version}"
        )
    rows = [row for key in sorted(records) for row in records[key]["scenarios"]]
    ids = [row["scenario_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise RegressionError("a scenario appears in more than one shard")
    expected = {int(record["library_scenarios"]) for record in records.values()}
    if expected != {len(rows)}:
        raise RegressionError(
            f"shards cover {len(rows)} scenario(s), the library version had {sorted(expected)}"
        )
    return identity, rows


# ---------------------------------------------------------------------------------- report
def _summary(metrics: Mapping[str, Any], verdict_failures: Sequence[str], passed: bool) -> dict:
    timings = {}
    for name in ("planner_ms", "perception_ms", "simulator_ms"):
        values = sorted(metrics.get(name) or [])
        if values:
            stem = name.removesuffix("_ms")
            timings[f"{stem}_mean_ms"] = round(sum(values) / len(values), 4)
            timings[f"{stem}_p95_ms"] = round(
                values[min(len(values) - 1, int(0.95 * len(values)))], 4
            )
    return {
        "passed": passed,
        "failures": list(verdict_failures),
        **{name: metrics.get(name) for name in REPORT_METRICS},
        **timings,
    }


def comparison_rows(comparisons: Sequence[ScenarioComparison], rows: Sequence[Mapping]) -> list:
    cached = {row["scenario_id"]: row.get("cached", {}) for row in rows}
    return [
        {
            "scenario_id": c.scenario_id,
            "slice": c.slice,
            "kind": c.kind,
            "road_type": c.road_type,
            "status": c.status,
            "first_fixed_by": c.first_fixed_by,
            "candidate": _summary(
                c.candidate, c.candidate_verdict.failures, c.candidate_verdict.passed
            ),
            "production": _summary(
                c.production, c.production_verdict.failures, c.production_verdict.passed
            ),
            "cached": cached.get(c.scenario_id, {}),
        }
        for c in comparisons
    ]


def build_report(
    identity: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    gate: GateResult,
    *,
    shards: int,
    gates_version: str,
) -> dict[str, Any]:
    return {
        "format": REPORT_FORMAT,
        "gate": "regression_simulation",
        "model_version": str(identity["model_version"]),
        "passed": gate.passed,
        "failures": gate.failures,
        "candidate": {
            "model_version": str(identity["model_version"]),
            "engine_sha256": identity["candidate_engine_sha256"],
        },
        "production": {
            "model_version": identity["production_version"],
            "engine_sha256": identity["production_engine_sha256"],
        },
        "library_version": identity["library_version"],
        "simulator_fingerprint": identity["simulator_fingerprint"],
        "shards": shards,
        "gates_version": gates_version,
        "aggregate": gate.aggregate,
        "slices": gate.slices,
        "scenarios": comparison_rows(gate.comparisons, rows),
    }


def report_outcomes(report: Mapping[str, Any]) -> tuple[list[dict], dict[str, dict]]:
    """(outcome rows, records) reconstructed from a stored report, to re-run the gate on it."""
    outcomes = [
        {
            "scenario_id": row["scenario_id"],
            "slice": row["slice"],
            "kind": row["kind"],
            "road_type": row["road_type"],
            "candidate": row["candidate"],
            "production": row["production"],
        }
        for row in report["scenarios"]
    ]
    records = {
        row["scenario_id"]: {"first_fixed_by": row["first_fixed_by"]} for row in report["scenarios"]
    }
    return outcomes, records


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


TABLE_COLUMNS = (
    ("scenario", "scenario_id"),
    ("slice", "slice"),
    ("status", "status"),
)
ENGINE_COLUMNS = (
    ("pass", "passed"),
    ("collision", "collision"),
    ("min TTC s", "min_ttc_s"),
    ("progress m", "progress_m"),
    ("hard brakes", "hard_brakes"),
    ("max jerk m/s³", "max_abs_jerk_mps3"),
    ("fallbacks", "fallback_activations"),
    ("planner p95 ms", "planner_p95_ms"),
    ("engine p95 ms", "perception_p95_ms"),
)


def report_table_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per scenario) for a metadata table: candidate columns, then production's
    pass / collision / progress."""
    table = []
    for row in report["scenarios"]:
        flat: dict[str, Any] = {title: row[key] for title, key in TABLE_COLUMNS}
        for title, key in ENGINE_COLUMNS:
            flat[f"cand. {title}"] = row["candidate"].get(key)
        for title, key in ENGINE_COLUMNS[:4]:
            flat[f"prod. {title}"] = row["production"].get(key)
        table.append(flat)
    return table


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: verdict, failures, aggregate and slice rates, scenario table."""
    aggregate = report["aggregate"]
    lines = [
        f"## Regression simulation — model version {report['model_version']}: "
        + ("**PASSED**" if report["passed"] else "**REFUSED**"),
        "",
        f"candidate engine `{str(report['candidate']['engine_sha256'])[:12]}` vs production "
        f"{report['production']['model_version']} "
        f"(`{str(report['production']['engine_sha256'])[:12]}`), library version "
        f"{report['library_version']}, {aggregate['scenarios']} scenarios in "
        f"{report['shards']} shard(s).",
        "",
        f"collision rate: candidate {aggregate['candidate_collision_rate']:.3f}, production "
        f"{aggregate['production_collision_rate']:.3f} (budget +"
        f"{aggregate['collision_rate_budget']:.3f}); scenarios passed: candidate "
        f"{aggregate['candidate_passed']}, production {aggregate['production_passed']}.",
    ]
    if report["failures"]:
        lines += ["", "### Gate failures", *(f"- {failure}" for failure in report["failures"])]
    lines += ["", "### Slices", "", "| slice | scenarios | cand. collisions | prod. collisions |"]
    lines += ["| --- | --- | --- | --- |"]
    for s in report["slices"]:
        lines.append(
            f"| {s['slice']} | {s['scenarios']} | {s['candidate_collisions']} | "
            f"{s['production_collisions']} |"
        )
    rows = report_table_rows(report)
    if rows:
        headers = list(rows[0])
        lines += ["", "### Scenarios", "", "| " + " | ".join(headers) + " |"]
        lines.append("| " + " | ".join("---" for _ in headers) + " |")
        for row in rows:
            lines.append("| " + " | ".join(_fmt(row[h]) for h in headers) + " |")
    return "\n".join(lines) + "\n"
