"""Regression simulation as plain functions: simulate one shard, aggregate shards into a report.

:func:`run_shard` drives four planners — the candidate's ship engine, the production engine, the
oracle (ground-truth perception) and model zero — on every scenario of one shard, each over the
configured seeds, and returns the shard's record plus the new cache objects. A planner is
simulated once per (engine identity, scenario, seed): identical engines (production == model zero
before the first release, candidate == production in an A/A run) share their episodes, and
outcomes already in the per-engine cache are reused. :func:`aggregate_shards` refuses shards
that were simulated for different candidates, engines, library versions, seed counts or
simulator settings, and :func:`build_report` turns the gate's verdict into the report
certification reads (top-level ``passed`` and ``model_version``, the four planners' at-fault
counts, one row per scenario with every seed's metrics the gate used).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.fleet.settings import FleetConfig
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION
from aiinfra_pipelines.vehicle.degradation import MINIMAL_RISK

from .candidate import load_candidate, load_model_zero, load_production
from .gate_comparison import GateResult, ScenarioComparison, compare_outcomes
from .gate_scenarios import needs_confirmation
from .gate_verdicts import ScenarioResult, gate_section
from .library import LIBRARY_KEY, records_by_id, scenarios_of_shard
from .results import cached_metrics, outcome_record, result_key, shard_result_key
from .runner import (
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
from .scenarios import Scenario, scenario_seeds
from .settings import (
    EpisodeSettings,
    ExecutionSettings,
    pinned_simulation_config,
    simulator_fingerprint,
)

REPORT_FORMAT = 2
# The shard fields that must agree before shards may be aggregated into one report.
SHARD_IDENTITY = (
    "model_version",
    "candidate_engine_sha256",
    "production_version",
    "production_engine_sha256",
    "model_zero_version",
    "model_zero_engine_sha256",
    "library_version",
    "simulator_fingerprint",
    "seeds_per_scenario",
    "confirm_seeds",
)
# Metrics the report keeps per engine, scenario and seed (the gate needs the first nine).
REPORT_METRICS = (
    "seed",
    "collision",
    "at_fault_collision",
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
    "collision_type",
    "collision_fault",
    # The car's degradation state machine (vehicle.degradation): every transition with its
    # step and cause, the steps spent degraded and in minimal risk, the engine's errors.
    "degradation_transitions",
    "degraded_steps",
    "minimal_risk_steps",
    "engine_errors",
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


def run_shard(
    lake: VersionedLake,
    shard_key: str,
    *,
    shards: int | None = None,
    model_version: str | None = None,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
    workers: int | None = None,
    gates: Mapping[str, Any] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> ShardRun:
    """Simulate candidate, production, oracle and model zero on every scenario of ``shard_key``
    (one of ``shards`` shards, default simulation.yaml's count), each over its seeds; a scenario
    whose verdict would fail the gate (``gates``, default gates.yaml) runs ``confirm_seeds``
    more seeds for every planner first."""
    cfg = pinned_simulation_config(config)
    episode_settings = EpisodeSettings.load(cfg)
    gates = gate_section(gates)
    shards = shards or ExecutionSettings.load(cfg).shards
    library = read_library(lake)
    candidate = load_candidate(lake, model_version)
    production = load_production(lake, candidate.model_version)
    model_zero = load_model_zero()
    scenarios = scenarios_of_shard(library, shard_key, shards)
    fingerprint = simulator_fingerprint(cfg, fleet)
    seeds = episode_settings.seeds_per_scenario
    engines: dict[str, EngineSource | None] = {
        ROLE_CANDIDATE: candidate.engine,
        ROLE_PRODUCTION: production,
        ROLE_ORACLE: None,
        ROLE_MODEL_ZERO: model_zero,
    }
    identities = {role: engine_identity(source) for role, source in engines.items()}
    episodes = _EpisodeStore(lake, identities, fingerprint)
    seed_lists = {scenario.id: scenario_seeds(scenario, seeds) for scenario in scenarios}
    for scenario in scenarios:
        episodes.schedule(scenario, seed_lists[scenario.id])
    if on_progress is not None:
        on_progress(
            f"{shard_key}: {len(scenarios)} scenario(s) x {seeds} seed(s), "
            f"{len(set(identities.values()))} distinct planner(s); {len(episodes.jobs)} "
            f"episode(s) to simulate, {len(episodes.cached)} reused from the cache"
        )
    episodes.run(engines, workers=workers, sim_config=cfg, fleet=fleet)

    # Verdicts that would fail the gate are confirmed on more seeds before the gate sees them.
    extra = episode_settings.confirm_seeds
    confirmed = []
    if extra:
        confirmed = _failing_verdicts(
            scenarios, seed_lists, identities, episodes, library, gates, production.name
        )
        for scenario in scenarios:
            if scenario.id in confirmed:
                seed_lists[scenario.id] = scenario_seeds(scenario, seeds + extra)
                episodes.schedule(scenario, seed_lists[scenario.id])
        if confirmed and on_progress is not None:
            on_progress(
                f"{shard_key}: confirming {len(confirmed)} failing verdict(s) on {extra} more "
                f"seed(s) each ({', '.join(confirmed)}); {len(episodes.jobs)} more episode(s)"
            )
        episodes.run(engines, workers=workers, sim_config=cfg, fleet=fleet)
    rows = [
        _shard_row(scenario, seed_lists[scenario.id], identities, episodes.metrics, episodes.cached)
        for scenario in scenarios
    ]
    record = {
        "format": REPORT_FORMAT,
        "shard": shard_key,
        "shards": shards,
        **_planner_fields(candidate, production, model_zero),
        "library_version": int(library["library_version"]),
        "library_scenarios": len(library["scenarios"]),
        "simulator_fingerprint": fingerprint,
        "seeds_per_scenario": seeds,
        "confirm_seeds": extra,
        "confirmed_scenarios": confirmed,
        "simulated_runs": episodes.simulated,
        "reused_runs": len(episodes.cached),
        "scenarios": rows,
    }
    return ShardRun(record=record, cache_objects=episodes.cache_objects)


def _failing_verdicts(
    scenarios: Sequence[Scenario],
    seed_lists: Mapping[str, list[int]],
    identities: Mapping[str, str],
    episodes: _EpisodeStore,
    library: Mapping[str, Any],
    gates: Mapping[str, Any],
    production_name: str,
) -> list[str]:
    """Ids of the scenarios whose verdict on the seeds run so far would fail the gate."""
    rows = [
        _shard_row(scenario, seed_lists[scenario.id], identities, episodes.metrics, set())
        for scenario in scenarios
    ]
    first_release = production_name == BOOTSTRAP_VERSION
    comparisons = compare_outcomes(rows, records_by_id(library), gates, production_name)
    return [
        c.scenario_id
        for c in comparisons
        if needs_confirmation(c, gates, first_release=first_release)
    ]


def _planner_fields(candidate: Any, production: Any, model_zero: Any) -> dict[str, Any]:
    """Which engines a shard compared, by version and engine hash."""
    return {
        "model_version": candidate.model_version,
        "candidate_engine_sha256": candidate.engine.sha256,
        "production_version": production.name,
        "production_engine_sha256": production.sha256,
        "model_zero_version": model_zero.name,
        "model_zero_engine_sha256": model_zero.sha256,
    }


class _EpisodeStore:
    """Every (engine identity, scenario, seed) episode of a shard, each simulated or read from
    the cache at most once: the same engine in two roles (A/A, production == model zero) and
    seeds scheduled twice (a confirmation re-using the first seeds) share one episode."""

    def __init__(
        self, lake: VersionedLake, identities: Mapping[str, str], fingerprint: str
    ) -> None:
        self.lake = lake
        self.identities = identities
        self.fingerprint = fingerprint
        self.metrics: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.cached: set[tuple[str, str, int]] = set()
        self.cache_objects: dict[str, bytes] = {}
        self.jobs: list[SimulationJob] = []
        self.simulated = 0
        self._keys: list[tuple[str, str, int]] = []  # one per job, in job order
        self._pending: set[tuple[str, str, int]] = set()
        self._scenarios: dict[str, Scenario] = {}

    def schedule(self, scenario: Scenario, seeds: Sequence[int]) -> None:
        self._scenarios[scenario.id] = scenario
        for seed in seeds:
            for role in ROLES:
                identity = self.identities[role]
                key = (identity, scenario.id, seed)
                if key in self.metrics or key in self._pending:
                    continue
                hit = cached_metrics(
                    self.lake, MAIN_BRANCH, identity, scenario, seed, self.fingerprint
                )
                if hit is not None:
                    self.metrics[key] = hit
                    self.cached.add(key)
                else:
                    self.jobs.append(SimulationJob(role, scenario.to_dict(), seed))
                    self._keys.append(key)
                    self._pending.add(key)

    def run(
        self,
        engines: Mapping[str, EngineSource | None],
        *,
        workers: int | None,
        sim_config: dict[str, Any],
        fleet: FleetConfig | None,
    ) -> None:
        """Simulate what is scheduled; new outcomes become cache objects to publish."""
        if not self.jobs:
            return
        results = simulate(self.jobs, engines, workers=workers, sim_config=sim_config, fleet=fleet)
        for key, job, result in zip(self._keys, self.jobs, results, strict=True):
            identity, scenario_id, seed = key
            self.metrics[key] = result
            scenario = self._scenarios[scenario_id]
            source = engines[job.role]
            name = "ground truth" if source is None else source.name
            record = outcome_record(name, identity, scenario, seed, self.fingerprint, result)
            self.cache_objects[result_key(identity, scenario, seed)] = json_document(record)
        self.simulated += len(self.jobs)
        self.jobs, self._keys, self._pending = [], [], set()


def _shard_row(
    scenario: Scenario,
    seeds: Sequence[int],
    identities: Mapping[str, str],
    metrics: Mapping[tuple[str, str, int], dict[str, Any]],
    cached: set[tuple[str, str, int]],
) -> dict[str, Any]:
    """One scenario: per role its episodes (one per seed, in seed order); ``cached`` says per
    role whether every episode came from the cache."""
    row: dict[str, Any] = {
        "scenario_id": scenario.id,
        "scenario_version": scenario.version,
        "slice": scenario.slice,
        "kind": scenario.kind,
        "road_type": scenario.road_type,
        "seeds": list(seeds),
        "cached": {},
    }
    for role, identity in identities.items():
        keys = [(identity, scenario.id, seed) for seed in seeds]
        row[role] = [metrics[key] for key in keys]
        row["cached"][role] = all(key in cached for key in keys)
    return row


def shard_objects(run: ShardRun) -> dict[str, bytes]:
    """Everything a shard publishes: its record and the outcomes it newly simulated."""
    return {shard_result_key(run.record["shard"]): json_document(run.record), **run.cache_objects}


# ------------------------------------------------------------------------------ aggregation
def read_shards(
    lake: VersionedLake, keys: Sequence[str], ref: str = MAIN_BRANCH
) -> dict[str, dict[str, Any] | None]:
    """Every shard's latest record on ``ref`` (``None`` where a shard never ran)."""
    return {key: lake.get_json_or_none(ref, shard_result_key(key)) for key in keys}


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
def _episode_summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    timings = {}
    for name in ("planner_ms", "perception_ms", "simulator_ms"):
        values = sorted(metrics.get(name) or [])
        if values:
            stem = name.removesuffix("_ms")
            timings[f"{stem}_mean_ms"] = round(sum(values) / len(values), 4)
            timings[f"{stem}_p95_ms"] = round(
                values[min(len(values) - 1, int(0.95 * len(values)))], 4
            )
    summary = {**{name: metrics.get(name) for name in REPORT_METRICS}, **timings}
    # Outcomes cached before the state machine existed carry no transitions: none happened.
    summary["degradation_transitions"] = [
        {key: t.get(key) for key in ("step", "from_state", "to_state", "cause")}
        for t in metrics.get("degradation_transitions") or []
    ]
    return summary


def _degradation_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Transitions of the degradation state machine over a scenario's seeds: how many, by
    cause, and how many episodes reached minimal risk."""
    transitions = [t for s in summaries for t in s["degradation_transitions"]]
    causes: dict[str, int] = {}
    for transition in transitions:
        causes[str(transition["cause"])] = causes.get(str(transition["cause"]), 0) + 1
    return {
        "degradation_transition_count": len(transitions),
        "degradation_causes": dict(sorted(causes.items())),
        "minimal_risk_episodes": sum(
            any(t["to_state"] == MINIMAL_RISK for t in s["degradation_transitions"])
            for s in summaries
        ),
    }


def _summary(episodes: Sequence[Mapping[str, Any]], result: ScenarioResult) -> dict[str, Any]:
    """One engine on one scenario: its verdict over the seeds, then every episode."""
    summaries = [_episode_summary(e) for e in episodes]

    def mean(name: str) -> float | None:
        values = [s[name] for s in summaries if s.get(name) is not None]
        return round(sum(values) / len(values), 4) if values else None

    return {
        "passed": result.passed,
        "pass_rate": result.pass_rate,
        "failures": list(result.failures),
        "at_fault_collisions": result.at_fault,
        "collisions": result.collisions,
        "mean_progress_m": mean("progress_m"),
        "min_ttc_s": min(
            (s["min_ttc_s"] for s in summaries if s.get("min_ttc_s") is not None), default=None
        ),
        "planner_p95_ms": mean("planner_p95_ms"),
        "perception_p95_ms": mean("perception_p95_ms"),
        "fallback_activations": sum(int(s.get("fallback_activations") or 0) for s in summaries),
        **_degradation_summary(summaries),
        "episodes": [
            {**summary, "passed": verdict.passed, "failures": list(verdict.failures)}
            for summary, verdict in zip(summaries, result.verdicts, strict=True)
        ],
    }


def comparison_rows(comparisons: Sequence[ScenarioComparison], rows: Sequence[Mapping]) -> list:
    cached = {row["scenario_id"]: row.get("cached", {}) for row in rows}
    table = []
    for c in comparisons:
        entry: dict[str, Any] = {
            "scenario_id": c.scenario_id,
            "slice": c.slice,
            "kind": c.kind,
            "road_type": c.road_type,
            "status": c.status,
            "first_fixed_by": c.first_fixed_by,
            "seeds": c.candidate_verdict.episodes,
        }
        for role in ROLES:
            result = c.result(role)
            entry[role] = None if result is None else _summary(getattr(c, role), result)
        entry["cached"] = cached.get(c.scenario_id, {})
        table.append(entry)
    return table


# The figures a reader (and the demo summary) looks for first: at-fault counts per planner.
HEADLINE_KEYS = (
    "scenarios",
    "seeds_per_scenario",
    "confirmed_scenarios",
    "episodes",
    "candidate_at_fault",
    "production_at_fault",
    "oracle_at_fault",
    "model_zero_at_fault",
    "candidate_collisions",
    "production_collisions",
    "oracle_collisions",
    "model_zero_collisions",
    "candidate_passed",
    "production_passed",
    "oracle_passed",
    "model_zero_passed",
)


def headline(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's headline figures (``HEADLINE_KEYS``: ``scenarios`` is a count here)."""
    aggregate = report["aggregate"]
    return {key: aggregate.get(key) for key in HEADLINE_KEYS}


def build_report(
    identity: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    gate: GateResult,
    *,
    shards: int,
    gates_version: str,
) -> dict[str, Any]:
    """The report certification reads: top-level ``passed`` / ``model_version``, the headline
    at-fault counts of all four planners, aggregate and slice rates, one row per scenario."""
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
        # The release this candidate was gated against (release.reference; the bootstrap
        # engine's name before any release): what a rollout may supersede.
        "reference_version": identity["production_version"],
        "model_zero": {
            "model_version": identity.get("model_zero_version"),
            "engine_sha256": identity["model_zero_engine_sha256"],
        },
        "oracle": {"perception": "ground truth"},
        "library_version": identity["library_version"],
        "simulator_fingerprint": identity["simulator_fingerprint"],
        "seeds_per_scenario": identity["seeds_per_scenario"],
        "shards": shards,
        "gates_version": gates_version,
        "summary": {key: gate.aggregate.get(key) for key in HEADLINE_KEYS},
        "aggregate": gate.aggregate,
        "slices": gate.slices,
        "scenarios": comparison_rows(gate.comparisons, rows),
    }


def report_outcomes(report: Mapping[str, Any]) -> tuple[list[dict], dict[str, dict]]:
    """(outcome rows, records) reconstructed from a stored report, to re-run the gate on it:
    every role's per-seed episodes as the report kept them."""
    outcomes = [
        {
            "scenario_id": row["scenario_id"],
            "slice": row["slice"],
            "kind": row["kind"],
            "road_type": row["road_type"],
            **{role: (row.get(role) or {}).get("episodes") for role in ROLES},
        }
        for row in report["scenarios"]
    ]
    records = {
        row["scenario_id"]: {"first_fixed_by": row["first_fixed_by"]} for row in report["scenarios"]
    }
    return outcomes, records
