"""The regression gate's error rates, measured through its own code on simulated outcomes.

A gate is a decision with two error rates: how often it refuses a candidate as good as its
reference, and how often it catches each regression it exists for. Both are measured here by
pushing simulated outcome tables through exactly what a real report does — the content-derived
seeds (:func:`.scenarios.scenario_seeds`), the stages of the evidence plan
(:func:`.evidence.collect_evidence`), the paired tests (:func:`.gate.evaluate_gate`), the fix
records of an earlier cycle (:func:`.library.record_results`) and the first-release rule —
only the simulator is replaced by an :class:`OutcomeTable`.

The outcome model. Each scenario has, per engine, a chance that an episode fails (any
criterion) and a chance that it ends in an at-fault collision (part of the failures). Engines
drive the same seeds, and what makes a seed hard makes it hard for every engine: an episode's
outcome is ``u < p`` for ``u = Φ(√ρ·Z_seed + √(1-ρ)·Z_engine)``, where ``Z_seed`` is shared by
every engine on that scenario × seed and ``Z_engine`` is the engine's own perception noise. A
byte-identical engine has the same ``Z_engine`` and so the same outcomes. Libraries are drawn
like the demo's reports (:func:`demo_like_library`): about half the scenarios easy, the rest
borderline or hard, a sixth of failures at fault.

Everything is a pure function of the calibration's seed, so a test can pin the figures.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .evidence import collect_evidence
from .gate import evaluate_gate
from .gate_comparison import binding_fixer
from .gate_settings import SimulationGate
from .gate_verdicts import gate_section
from .library import record_results
from .roles import ROLE_CANDIDATE, ROLE_FIXER, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION
from .scenarios import KIND_BASE, Scenario, scenario_seeds

SLICES = tuple(
    f"{light}/{weather}/{road}"
    for light in ("day", "night")
    for weather in ("clear", "rain", "fog")
    for road in ("highway", "merge")
)
BOOTSTRAP = "bootstrap-0"
# Outcome templates (the fields the gate's episode criteria read).
_PASSED = {
    "collision": False,
    "collision_step": None,
    "min_ttc_s": 3.0,
    "hard_brakes": 0,
    "progress_m": 200.0,
    "duration_s": 8.0,
}
_AT_FAULT = {
    **_PASSED,
    "collision": True,
    "collision_step": 20,
    "at_fault_collision": True,
    "collision_type": "active_front",
    "min_ttc_s": 0.0,
}
_FAILED = {**_PASSED, "hard_brakes": 9}


@dataclass(frozen=True)
class Odds:
    """One engine on one scenario: chance an episode fails, and that it is at fault."""

    fail: float
    at_fault: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.at_fault <= self.fail <= 1.0:
            raise ValueError(f"odds need 0 <= at_fault <= fail <= 1: {self}")

    def worse_at_fault(self, at_fault: float) -> Odds:
        """These odds with the at-fault chance raised to ``at_fault`` (failures with it)."""
        return Odds(fail=max(self.fail, at_fault), at_fault=at_fault)


@dataclass(frozen=True)
class Engine:
    """An engine as the outcome model sees it: identity (its own noise), correlation with the
    seed's shared difficulty, and odds per scenario id."""

    identity: str
    odds: Mapping[str, Odds]
    rho: float

    def with_odds(self, identity: str, changes: Mapping[str, Odds]) -> Engine:
        return replace(self, identity=identity, odds={**self.odds, **changes})


@dataclass
class OutcomeTable:
    """Simulated episodes of every engine on every scenario × seed: the calibration's
    :class:`.evidence.EpisodeSource`. Counts what the gate made it drive."""

    trial: int
    engines: Mapping[str, Engine]  # by role
    fixers: Mapping[str, Engine] = field(default_factory=dict)  # by scenario id
    driven: int = 0
    _shared: dict[str, np.ndarray] = field(default_factory=dict)
    _own: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    _index: dict[str, dict[int, int]] = field(default_factory=dict)

    def engine(self, scenario: Scenario, role: str) -> Engine:
        return self.fixers[scenario.id] if role == ROLE_FIXER else self.engines[role]

    def schedule(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> None:
        self.driven += len(seeds)

    def run(self) -> None:
        """Nothing to simulate: outcomes are drawn when read."""

    def episodes(self, scenario: Scenario, role: str, seeds: Sequence[int]) -> list[dict]:
        engine = self.engine(scenario, role)
        odds = engine.odds[scenario.id]
        index = self._seed_index(scenario)
        shared = self._normals(scenario.id, "", len(index))
        own = self._normals(scenario.id, engine.identity, len(index))
        weight, rest = math.sqrt(engine.rho), math.sqrt(1.0 - engine.rho)
        episodes = []
        for seed in seeds:
            i = index[int(seed)]
            latent = weight * float(shared[i]) + rest * float(own[i])
            u = 0.5 * (1.0 + math.erf(latent / math.sqrt(2.0)))
            template = _AT_FAULT if u < odds.at_fault else _FAILED if u < odds.fail else _PASSED
            episodes.append({**template, "seed": int(seed)})
        return episodes

    def _seed_index(self, scenario: Scenario) -> dict[int, int]:
        if scenario.id not in self._index:
            self._index[scenario.id] = _seed_positions(scenario)
        return self._index[scenario.id]

    def _normals(self, scenario_id: str, identity: str, count: int) -> np.ndarray:
        cache = self._shared if not identity else None
        key = (scenario_id, identity)
        if cache is not None and scenario_id in cache:
            return cache[scenario_id]
        if cache is None and key in self._own:
            return self._own[key]
        entropy = int.from_bytes(
            hashlib.sha256(f"{self.trial}|{scenario_id}|{identity}".encode()).digest()[:8], "big"
        )
        values = np.random.default_rng(entropy).standard_normal(count)
        if cache is not None:
            cache[scenario_id] = values
        else:
            self._own[key] = values
        return values


SEED_HORIZON = 200  # seeds per scenario the outcome model can draw (>= any plan's last stage)


_POSITIONS: dict[str, dict[int, int]] = {}


def _seed_positions(scenario: Scenario) -> dict[int, int]:
    """Where each of a scenario's seeds sits in its sequence (the outcome model's index)."""
    version = scenario.version
    if version not in _POSITIONS:
        seeds = scenario_seeds(scenario, SEED_HORIZON)
        _POSITIONS[version] = {seed: i for i, seed in enumerate(seeds)}
    return _POSITIONS[version]


# ---------------------------------------------------------------------------------- libraries
def calibration_scenarios(count: int) -> list[Scenario]:
    """``count`` scenarios over the calibration's slices (definitions matter only through
    their seeds, which hash them)."""
    scenarios = []
    for index in range(count):
        lighting, weather, road = SLICES[index % len(SLICES)].split("/")
        scenarios.append(
            Scenario(
                id=f"s{index:03d}",
                kind=KIND_BASE,
                family="calibration",
                road_type=road,
                weather=weather,
                lighting=lighting,
                traffic="normal",
                duration_s=8.0,
                seed=index,
            )
        )
    return scenarios


def demo_like_library(rng: np.random.Generator, scenarios: Sequence[Scenario]) -> dict[str, Odds]:
    """Production's odds per scenario, spread like the demo's reports: 45 % easy (an episode
    fails 5 % of the time, 3 % at fault), 30 % borderline (fails 15-50 %), 25 % hard (50-95 %),
    a sixth of their failures at fault — the at-fault rate of the library about 0.055."""
    odds = {}
    for scenario in scenarios:
        draw = rng.random()
        if draw < 0.45:
            odds[scenario.id] = Odds(fail=0.05, at_fault=0.03)
        else:
            fail = float(rng.uniform(0.15, 0.5) if draw < 0.75 else rng.uniform(0.5, 0.95))
            odds[scenario.id] = Odds(fail=fail, at_fault=fail / 6)
    return odds


def easy_ids(odds: Mapping[str, Odds]) -> list[str]:
    return sorted(sid for sid, o in odds.items() if o.fail <= 0.05)


# ---------------------------------------------------------------------------------- trials
@dataclass(frozen=True)
class CalibrationModel:
    """The outcome model's settings (the correlation of engines on a shared seed)."""

    scenarios: int = 60
    rho: float = 0.5  # same-release-line engines (candidate, production, fixer)
    oracle_rho: float = 0.3
    fixed_scenarios: int = 3  # scenarios the fixer fixed in the earlier cycle


@dataclass
class GateRun:
    passed: bool
    failures: list[str]
    episodes: int
    candidate_episodes: int


def run_report(
    trial: int,
    scenarios: Sequence[Scenario],
    engines: Mapping[str, Engine],
    gates: Mapping[str, Any],
    *,
    library: Mapping[str, Any] | None = None,
    production_version: str = "1",
    fixer_engines: Mapping[str, Engine] | None = None,
) -> tuple[GateRun, Any]:
    """One regression report on simulated outcomes: the evidence plan, then the gate."""
    section = gate_section(gates)
    plan = SimulationGate.from_section(section).evidence
    records = {e["id"]: e for e in (library or {}).get("scenarios", [])}
    first_release = production_version == BOOTSTRAP
    fixers: dict[str, Engine] = {}
    fixer_versions: dict[str, str] = {}
    for scenario in scenarios:
        binding = binding_fixer(records.get(scenario.id), production_version)
        if binding is not None and fixer_engines is not None:
            fixers[scenario.id] = fixer_engines[binding[0]]
            fixer_versions[scenario.id] = binding[0]
    table = OutcomeTable(trial, engines, fixers)
    evidence = collect_evidence(
        scenarios,
        plan,
        table,
        records=records,
        gates=section,
        production_version=production_version,
        first_release=first_release,
        fixers=fixer_versions,
    )
    rows = [item.row(table) for item in evidence]
    gate = evaluate_gate(
        rows,
        records,
        section,
        first_release=first_release,
        production_version=production_version,
    )
    run = GateRun(
        passed=gate.passed,
        failures=gate.failures,
        episodes=table.driven,
        candidate_episodes=sum(len(row[ROLE_CANDIDATE]) for row in rows),
    )
    return run, gate


def fresh_library(scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """A library with these scenarios and no records yet."""
    return {
        "library_version": 1,
        "scenarios": [
            {
                **s.to_dict(),
                "first_failed_by": None,
                "first_fixed_by": None,
                "fixed_engine_sha256": None,
            }
            for s in scenarios
        ],
    }


@dataclass
class Trial:
    """One simulated release line: a library, production, the oracle, model zero, and a
    version F that fixed a few scenarios production fails (recorded through the gate and
    the library's record rules in an earlier cycle, then not released)."""

    index: int
    scenarios: list[Scenario]
    production: Engine
    oracle: Engine
    model_zero: Engine
    fixer: Engine
    library: dict[str, Any]
    fixed: list[str]
    easy: list[str]


def _mixed(trial: int, tag: str) -> np.random.Generator:
    return np.random.default_rng(
        int.from_bytes(hashlib.sha256(f"{trial}|{tag}".encode()).digest()[:8], "big")
    )


def make_trial(trial: int, model: CalibrationModel, gates: Mapping[str, Any]) -> Trial:
    """A release line whose fixer's fixes were recorded by a real earlier report."""
    rng = _mixed(trial, "library")
    scenarios = calibration_scenarios(model.scenarios)
    base = demo_like_library(rng, scenarios)
    easy = easy_ids(base)
    fixed = sorted(rng.choice(easy, size=model.fixed_scenarios, replace=False).tolist())
    # Production fails the scenarios the fixer will fix (hard for it); the fixer passes them.
    production_odds = {**base, **{sid: Odds(fail=0.7, at_fault=0.1) for sid in fixed}}
    production = Engine("production-1", production_odds, model.rho)
    fixer = production.with_odds("fixer-2", {sid: base[sid] for sid in fixed})
    oracle = Engine(
        "oracle",
        {sid: Odds(fail=o.fail * 0.7, at_fault=o.at_fault) for sid, o in base.items()},
        model.oracle_rho,
    )
    model_zero = Engine(
        "model-zero", {sid: Odds(fail=0.97, at_fault=0.01) for sid in base}, model.oracle_rho
    )
    engines = {
        ROLE_CANDIDATE: fixer,
        ROLE_PRODUCTION: production,
        ROLE_ORACLE: oracle,
        ROLE_MODEL_ZERO: model_zero,
    }
    library = fresh_library(scenarios)
    run, gate = run_report(trial, scenarios, engines, gates, library=library)
    library, _ = record_results(
        library,
        gate.comparisons,
        candidate_version="2",
        production_version="1",
        candidate_accepted=run.passed,
        candidate_engine_sha256=fixer.identity,
        fix_alpha=SimulationGate.from_section(gate_section(gates)).levels.fix_alpha,
    )
    return Trial(
        trial,
        scenarios,
        production,
        oracle,
        model_zero,
        fixer,
        library,
        fixed,
        [sid for sid in easy if sid not in fixed],
    )


def candidate_report(trial: Trial, candidate: Engine, gates: Mapping[str, Any]) -> GateRun:
    """The candidate judged against production, held to the fixer's recorded fixes."""
    engines = {
        ROLE_CANDIDATE: candidate,
        ROLE_PRODUCTION: trial.production,
        ROLE_ORACLE: trial.oracle,
        ROLE_MODEL_ZERO: trial.model_zero,
    }
    run, _ = run_report(
        trial.index,
        trial.scenarios,
        engines,
        gates,
        library=trial.library,
        production_version="1",
        fixer_engines={"2": trial.fixer},
    )
    return run


def first_release_report(trial: Trial, candidate: Engine, gates: Mapping[str, Any]) -> GateRun:
    """A first candidate (production is model zero), judged against the oracle."""
    engines = {
        ROLE_CANDIDATE: candidate,
        ROLE_PRODUCTION: trial.model_zero,
        ROLE_ORACLE: trial.oracle,
        ROLE_MODEL_ZERO: trial.model_zero,
    }
    run, _ = run_report(
        trial.index,
        trial.scenarios,
        engines,
        gates,
        library=fresh_library(trial.scenarios),
        production_version=BOOTSTRAP,
    )
    return run


# What each figure's candidate is, given a trial. Refusal figures count refusals,
# certification figures count passes.
def _equal(trial: Trial) -> Engine:
    return trial.fixer.with_odds("candidate-aa", {})


def _easy_regressed(at_fault: float) -> Callable[[Trial], Engine]:
    def build(trial: Trial) -> Engine:
        sid = trial.easy[trial.index % len(trial.easy)]
        odds = trial.fixer.odds[sid].worse_at_fault(at_fault)
        return trial.fixer.with_odds(f"candidate-easy-{at_fault}", {sid: odds})

    return build


def _library_regressed(increase: float) -> Callable[[Trial], Engine]:
    def build(trial: Trial) -> Engine:
        changes = {
            sid: o.worse_at_fault(min(o.at_fault + increase, 1.0))
            for sid, o in trial.fixer.odds.items()
        }
        return trial.fixer.with_odds(f"candidate-library-{increase}", changes)

    return build


def _fix_regressed(trial: Trial) -> Engine:
    sid = trial.fixed[trial.index % len(trial.fixed)]
    return trial.fixer.with_odds("candidate-fix", {sid: Odds(fail=0.5, at_fault=0.25)})


def _first_release(increase: float) -> Callable[[Trial], Engine]:
    def build(trial: Trial) -> Engine:
        changes = {
            sid: o.worse_at_fault(min(o.at_fault + increase, 1.0))
            for sid, o in trial.oracle.odds.items()
        }
        return replace(trial.oracle, identity=f"first-{increase}", rho=trial.fixer.rho).with_odds(
            f"first-{increase}", changes
        )

    return build


@dataclass(frozen=True)
class Figure:
    name: str
    candidate: Callable[[Trial], Engine]
    first_release: bool = False
    counts_refusals: bool = True


FIGURES = (
    Figure("aa_certified", _equal, counts_refusals=False),
    Figure("scenario_regression_refused", _easy_regressed(0.5)),
    Figure("subtle_scenario_regression_refused", _easy_regressed(0.25)),
    Figure("library_regression_refused", _library_regressed(0.05)),
    Figure("small_library_regression_refused", _library_regressed(0.02)),
    Figure("fixed_scenario_regression_refused", _fix_regressed),
    Figure("first_release_bad_refused", _first_release(0.05), first_release=True),
    Figure(
        "first_release_aa_certified",
        _first_release(0.0),
        first_release=True,
        counts_refusals=False,
    ),
)


def calibrate(
    trials: int,
    gates: Mapping[str, Any],
    *,
    model: CalibrationModel | None = None,
    seed: int = 0,
    figures: Sequence[Figure] = FIGURES,
    on_trial: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Every figure over ``trials`` simulated release lines, with its Monte Carlo standard
    error, the episodes a report drove, and the model it assumed."""
    model = model or CalibrationModel()
    hits = dict.fromkeys((f.name for f in figures), 0)
    episodes: list[int] = []
    candidate_episodes: list[int] = []
    fixes_recorded = 0
    for offset in range(trials):
        trial = make_trial(seed * 1_000_003 + offset, model, gates)
        fixes_recorded += sum(bool(e.get("first_fixed_by")) for e in trial.library["scenarios"])
        for figure in figures:
            report = first_release_report if figure.first_release else candidate_report
            run = report(trial, figure.candidate(trial), gates)
            hits[figure.name] += (not run.passed) if figure.counts_refusals else run.passed
            if figure.name == "aa_certified":
                episodes.append(run.episodes)
                candidate_episodes.append(run.candidate_episodes)
        if on_trial is not None:
            on_trial(offset + 1)
    result: dict[str, Any] = {}
    for name, count in hits.items():
        share = count / trials
        result[name] = round(share, 4)
        result[f"{name}_se"] = round(float(np.sqrt(share * (1 - share) / trials)), 4)
    result.update(
        mean_episodes=round(float(np.mean(episodes)), 1) if episodes else 0.0,
        mean_candidate_episodes=(
            round(float(np.mean(candidate_episodes)), 1) if candidate_episodes else 0.0
        ),
        trials=trials,
        scenarios=model.scenarios,
        rho=model.rho,
        oracle_rho=model.oracle_rho,
        fixes_recorded_per_trial=round(fixes_recorded / trials, 2),
        seed=seed,
    )
    return result


def stated_targets(gates: Mapping[str, Any]) -> dict[str, float]:
    """Every figure's target as gates.yaml states it beside its test (``must_catch``,
    ``false_refusal``)."""
    section = gate_section(gates)
    found = dict(section.get("false_refusal") or {})
    for test in (section.get("tests") or {}).values():
        found.update((test or {}).get("must_catch") or {})
    found.update((section.get("first_release") or {}).get("must_catch") or {})
    return {str(name): float(value) for name, value in found.items()}
