"""One shard of a regression report: every scenario of the shard, every planner, in stages.

:func:`run_shard` drives the candidate's ship engine, the reference release it is gated
against (``production``), the oracle (ground-truth perception), model zero and — where the
library recorded a confirmed fix by another version — that fixer, on the seeds the gate's
evidence plan asks for (:mod:`.evidence`): every planner on the first stage of every scenario,
then the candidate and the references in doubt on the next stages of the scenarios in doubt.

A planner is simulated once per (engine identity, scenario version, seed, simulator
fingerprint): identical engines (production == model zero before the first release, an A/A
candidate) share their episodes, and outcomes already in the per-engine cache
(:mod:`.results`) are reused — across reports and cycles, since seeds are a pure function of
the scenario. Only what is new is simulated, in worker processes, stage by stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.fleet.settings import FleetConfig
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION

from .candidate import CandidateError, load_candidate, load_model_zero, load_reference
from .evidence import ScenarioEvidence, collect_evidence
from .gate_comparison import binding_fixer
from .gate_settings import SimulationGate
from .gate_verdicts import gate_section
from .library import LIBRARY_KEY, records_by_id, scenarios_of_shard
from .results import cached_metrics, outcome_record, result_key, shard_result_key
from .roles import ROLE_CANDIDATE, ROLE_FIXER, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION
from .runner import EngineSource, SimulationJob, engine_identity, simulate
from .scenarios import Scenario
from .settings import ExecutionSettings, pinned_simulation_config, simulator_fingerprint

SHARD_FORMAT = 3


class RegressionError(ValueError):
    """Shards cannot be simulated or aggregated (missing, or for different candidates)."""


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
    library_ref: str = MAIN_BRANCH,
    on_progress: Callable[[str], None] | None = None,
) -> ShardRun:
    """Drive every scenario of ``shard_key`` (one of ``shards``, default simulation.yaml's
    count) of the library at ``library_ref`` through the evidence plan of ``gates`` (default
    gates.yaml) and return the shard's record plus the outcomes it newly simulated (cache
    objects to publish)."""
    cfg = pinned_simulation_config(config)
    section = gate_section(gates)
    plan = SimulationGate.from_section(section).evidence
    shards = shards or ExecutionSettings.load(cfg).shards
    library = read_library(lake, library_ref)
    candidate = load_candidate(lake, model_version)
    production = load_reference(lake, candidate.model_version)
    model_zero = load_model_zero()
    scenarios = scenarios_of_shard(library, shard_key, shards)
    records = records_by_id(library)
    fixers = _binding_fixers(lake, scenarios, records, production.name)
    store = EpisodeStore(
        lake,
        {
            ROLE_CANDIDATE: candidate.engine,
            ROLE_PRODUCTION: production,
            ROLE_ORACLE: None,
            ROLE_MODEL_ZERO: model_zero,
        },
        fixers,
        simulator_fingerprint(cfg, fleet),
        run=lambda jobs, engines: simulate(
            jobs, engines, workers=workers, sim_config=cfg, fleet=fleet
        ),
    )

    def announce(stage: int, ids: list[str]) -> None:
        if on_progress is not None:
            on_progress(
                f"{shard_key}: {len(ids)} scenario(s) in doubt run up to {stage} seeds: "
                f"{', '.join(ids[:8])}{' …' if len(ids) > 8 else ''}"
            )

    if on_progress is not None:
        on_progress(
            f"{shard_key}: {len(scenarios)} scenario(s), first stage {plan.first_stage} seeds "
            f"of up to {plan.max_seeds}; {len(fixers)} held to a fix by another version"
        )
    evidence = collect_evidence(
        scenarios,
        plan,
        store,
        records=records,
        gates=section,
        production_version=production.name,
        first_release=production.name == BOOTSTRAP_VERSION,
        fixers={scenario_id: source.name for scenario_id, source in fixers.items()},
        on_stage=announce,
    )
    record = {
        "format": SHARD_FORMAT,
        "shard": shard_key,
        "shards": shards,
        **_planner_fields(candidate, production, model_zero),
        "library_version": int(library["library_version"]),
        "library_scenarios": len(library["scenarios"]),
        "simulator_fingerprint": store.fingerprint,
        "seed_stages": list(plan.seed_stages),
        "simulated_runs": store.simulated,
        "reused_runs": len(store.cached),
        "scenarios": [store.row(item) for item in evidence],
    }
    return ShardRun(record=record, cache_objects=store.cache_objects)


def _binding_fixers(
    lake: VersionedLake,
    scenarios: Sequence[Scenario],
    records: Mapping[str, Mapping[str, Any]],
    production_version: str,
) -> dict[str, EngineSource]:
    """The fixer engine each scenario is held to (hash-checked against its record)."""
    engines: dict[str, EngineSource] = {}
    loaded: dict[str, EngineSource] = {}
    for scenario in scenarios:
        binding = binding_fixer(records.get(scenario.id), production_version)
        if binding is None:
            continue
        version, sha256 = binding
        if version not in loaded:
            loaded[version] = load_candidate(lake, version).engine
        if loaded[version].sha256 != sha256:
            raise CandidateError(
                f"scenario {scenario.id}: the library records its fix by model version "
                f"{version} with engine {sha256[:12]}, but that version's ship engine on the "
                f"lake is {loaded[version].sha256[:12]}"
            )
        engines[scenario.id] = loaded[version]
    return engines


def _planner_fields(candidate: Any, production: EngineSource, model_zero: EngineSource) -> dict:
    """Which engines a shard compared, by version and engine hash."""
    return {
        "model_version": candidate.model_version,
        "candidate_engine_sha256": candidate.engine.sha256,
        "production_version": production.name,
        "production_engine_sha256": production.sha256,
        "model_zero_version": model_zero.name,
        "model_zero_engine_sha256": model_zero.sha256,
    }


class EpisodeStore:
    """Every (engine identity, scenario, seed) episode of a shard, each simulated or read from
    the cache at most once; the :class:`.evidence.EpisodeSource` of a real shard."""

    def __init__(
        self,
        lake: VersionedLake,
        engines: Mapping[str, EngineSource | None],
        fixers: Mapping[str, EngineSource],
        fingerprint: str,
        *,
        run: Callable[[list[SimulationJob], dict[str, EngineSource | None]], list[dict]],
    ) -> None:
        self.lake = lake
        self.engines = dict(engines)
        self.fixers = dict(fixers)
        self.fingerprint = fingerprint
        self._run = run
        self.metrics: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.cached: set[tuple[str, str, int]] = set()
        self.cache_objects: dict[str, bytes] = {}
        self.simulated = 0
        self._jobs: list[tuple[tuple[str, str, int], str, Scenario, int]] = []
        self._pending: set[tuple[str, str, int]] = set()

    def _engine_key(self, scenario: Scenario, role: str) -> str:
        """The engine's key in the workers' engine table (a fixer is per scenario)."""
        return f"{ROLE_FIXER}:{self.fixers[scenario.id].name}" if role == ROLE_FIXER else role

    def _source(self, scenario: Scenario, role: str) -> EngineSource | None:
        return self.fixers[scenario.id] if role == ROLE_FIXER else self.engines[role]

    def identity(self, scenario: Scenario, role: str) -> str:
        return engine_identity(self._source(scenario, role))

    def schedule(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> None:
        identity = self.identity(scenario, role)
        for seed in seeds:
            key = (identity, scenario.id, int(seed))
            if key in self.metrics or key in self._pending:
                continue
            hit = cached_metrics(self.lake, MAIN_BRANCH, identity, scenario, seed, self.fingerprint)
            if hit is not None:
                self.metrics[key] = hit
                self.cached.add(key)
            else:
                self._jobs.append((key, role, scenario, int(seed)))
                self._pending.add(key)

    def run(self) -> None:
        """Simulate what is scheduled; new outcomes become cache objects to publish."""
        if not self._jobs:
            return
        engines: dict[str, EngineSource | None] = dict(self.engines)
        for source in self.fixers.values():
            engines[f"{ROLE_FIXER}:{source.name}"] = source
        jobs = [
            SimulationJob(self._engine_key(scenario, role), scenario.to_dict(), seed)
            for _, role, scenario, seed in self._jobs
        ]
        results = self._run(jobs, engines)
        for (key, role, scenario, seed), result in zip(self._jobs, results, strict=True):
            self.metrics[key] = result
            source = self._source(scenario, role)
            name = "ground truth" if source is None else source.name
            record = outcome_record(name, key[0], scenario, seed, self.fingerprint, result)
            self.cache_objects[result_key(key[0], scenario, seed)] = json_document(record)
        self.simulated += len(self._jobs)
        self._jobs, self._pending = [], set()

    def episodes(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> list[dict]:
        identity = self.identity(scenario, role)
        return [self.metrics[(identity, scenario.id, int(seed))] for seed in seeds]

    def row(self, item: ScenarioEvidence) -> dict[str, Any]:
        """The scenario's outcome row, with which roles' episodes all came from the cache."""
        row = item.row(self)
        row["cached"] = {
            role: all(
                (self.identity(item.scenario, role), item.scenario.id, int(seed)) in self.cached
                for seed in item.seeds[: item.driven[role]]
            )
            for role in item.roles
        }
        if item.fixer_version:
            row["fixer_engine_sha256"] = self.fixers[item.scenario.id].sha256
        return row


def shard_objects(run: ShardRun) -> dict[str, bytes]:
    """Everything a shard publishes: its record and the outcomes it newly simulated."""
    return {shard_result_key(run.record["shard"]): json_document(run.record), **run.cache_objects}
