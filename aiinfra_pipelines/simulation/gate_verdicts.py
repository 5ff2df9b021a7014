"""Judging one engine: an episode against the pass criteria, a scenario over its seeds.

Everything here looks at a single engine's episodes and the ``gates.yaml`` ``simulation:``
criteria; pairing engines seed by seed and the tests build on it in the other ``gate_*``
modules (:mod:`.gate` is the entry point).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.statistics.paired import PairedCounts

from .settings import simulation_gates

EPS = 1e-9  # pass rates are compared with this slack
# What a paired test counts as a bad episode: any broken criterion, or an at-fault collision.
FAILED = "failed"
AT_FAULT = "at_fault"


@dataclass(frozen=True)
class Verdict:
    """One episode's verdict."""

    passed: bool
    failures: tuple[str, ...]


def gate_section(gates: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The ``simulation:`` gates from a whole gates mapping, the section itself, or the file."""
    if gates is None or "simulation" in gates:
        return simulation_gates(None if gates is None else dict(gates))
    return gates


def scenario_criteria(scenario_id: str, gates: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pass criteria for one scenario: ``scenario_pass`` with the first matching override."""
    section = gate_section(gates)
    criteria = dict(section["scenario_pass"])
    for pattern, override in (section.get("scenario_overrides") or {}).items():
        if fnmatch.fnmatchcase(scenario_id, str(pattern)):
            criteria.update(override)
            break
    return criteria


def min_pass_rate(gates: Mapping[str, Any] | None = None) -> float:
    """The pass rate over seeds at which an engine passes a scenario."""
    return float(gate_section(gates)["pass_rate"]["min_pass_rate"])


def at_fault(metrics: Mapping[str, Any]) -> bool:
    """Whether ego caused the episode's collision; an unclassified collision counts as ego's."""
    if not metrics.get("collision"):
        return False
    return bool(metrics.get("at_fault_collision", True))


def scenario_verdict(
    metrics: Mapping[str, Any], road_type: str, criteria: Mapping[str, Any]
) -> Verdict:
    """Whether one episode passes; ``failures`` says which criteria it broke and by how much."""
    failures = []
    if criteria.get("no_at_fault_collision", True) and at_fault(metrics):
        kind = metrics.get("collision_type") or "unclassified"
        failures.append(f"at-fault collision ({kind}) at step {metrics['collision_step']}")
    elif criteria.get("no_collision", False) and metrics["collision"]:
        failures.append(f"collision at step {metrics['collision_step']}")
    ttc = metrics.get("min_ttc_s")
    floor = criteria.get("min_ttc_s")
    if floor is not None and ttc is not None and ttc < float(floor):
        failures.append(f"min TTC {ttc:.2f} s < {float(floor):.2f} s")
    most = criteria.get("max_hard_brakes")
    if most is not None and metrics["hard_brakes"] > int(most):
        failures.append(f"{metrics['hard_brakes']} hard brakes > {int(most)}")
    progress = criteria.get("min_progress_mps")
    if isinstance(progress, Mapping):
        if road_type not in progress:
            raise KeyError(f"gates.yaml simulation min_progress_mps has no {road_type!r}")
        progress = progress[road_type]
    if progress is not None and not metrics["collision"]:
        rate = float(metrics["progress_m"]) / max(float(metrics["duration_s"]), 1e-9)
        if rate < float(progress):
            failures.append(f"progress {rate:.1f} m/s < {float(progress):.1f} m/s")
    return Verdict(passed=not failures, failures=tuple(failures))


@dataclass(frozen=True)
class ScenarioResult:
    """One engine on one scenario over its seeds: per-episode verdicts and the pass rate."""

    seeds: tuple[int | None, ...]
    verdicts: tuple[Verdict, ...]
    pass_rate: float
    passed: bool  # pass_rate >= min_pass_rate
    collisions: int  # episodes ending in any collision
    at_fault: int  # episodes ending in a collision ego caused
    at_fault_by_seed: tuple[bool, ...] = ()
    collided_by_seed: tuple[bool, ...] = ()
    threshold: float = 0.0  # the pass rate the scenario verdict used

    @property
    def episodes(self) -> int:
        return len(self.verdicts)

    @property
    def passes(self) -> int:
        return sum(v.passed for v in self.verdicts)

    @property
    def failures(self) -> tuple[str, ...]:
        """Every failed criterion, prefixed with the seed of its episode."""
        return tuple(
            f"seed {seed}: {failure}"
            for seed, verdict in zip(self.seeds, self.verdicts, strict=True)
            for failure in verdict.failures
        )

    def describe(self) -> str:
        return f"{self.passes}/{self.episodes} seeds pass"

    def restricted(self, seeds: Collection[int | None]) -> ScenarioResult:
        """The same engine judged on ``seeds`` only (episodes are not judged again)."""
        keep = [i for i, seed in enumerate(self.seeds) if seed in seeds]
        verdicts = tuple(self.verdicts[i] for i in keep)
        faults = tuple(self.at_fault_by_seed[i] for i in keep)
        collided = tuple(self.collided_by_seed[i] for i in keep)
        rate = sum(v.passed for v in verdicts) / len(verdicts) if verdicts else 0.0
        return ScenarioResult(
            seeds=tuple(self.seeds[i] for i in keep),
            verdicts=verdicts,
            pass_rate=round(rate, 6),
            passed=bool(verdicts) and rate + EPS >= self.threshold,
            collisions=sum(collided),
            at_fault=sum(faults),
            at_fault_by_seed=faults,
            collided_by_seed=collided,
            threshold=self.threshold,
        )

    def bad_by_seed(self, outcome: str) -> dict[int | None, bool]:
        """Per seed, whether the episode was bad: ``failed`` (any criterion broken) or
        ``at_fault`` (ego caused a collision)."""
        if outcome == FAILED:
            return {s: not v.passed for s, v in zip(self.seeds, self.verdicts, strict=True)}
        if outcome == AT_FAULT:
            return dict(zip(self.seeds, self.at_fault_by_seed, strict=True))
        raise ValueError(f"unknown outcome {outcome!r}; expected {FAILED!r} or {AT_FAULT!r}")


def paired_counts(
    candidate: ScenarioResult,
    reference: ScenarioResult,
    outcome: str,
    seeds: Sequence[int | None] | None = None,
) -> PairedCounts:
    """The two engines' episodes paired seed by seed (on ``seeds`` only, when given): only
    seeds both drove form a pair."""
    cand, ref = candidate.bad_by_seed(outcome), reference.bad_by_seed(outcome)
    common = [s for s in cand if s in ref and (seeds is None or s in seeds)]
    return PairedCounts.of([cand[s] for s in common], [ref[s] for s in common])


def episodes_of(value: Any) -> list[Mapping[str, Any]]:
    """One engine's episodes of a scenario: a list (one per seed) or a single metrics mapping."""
    if value is None:
        return []
    return [value] if isinstance(value, Mapping) else list(value)


def scenario_result(
    episodes: Sequence[Mapping[str, Any]],
    road_type: str,
    criteria: Mapping[str, Any],
    threshold: float,
) -> ScenarioResult:
    """Judge every episode and the scenario's pass rate over them."""
    if not episodes:
        raise ValueError("a scenario result needs at least one episode")
    verdicts = tuple(scenario_verdict(e, road_type, criteria) for e in episodes)
    faults = tuple(at_fault(e) for e in episodes)
    collided = tuple(bool(e["collision"]) for e in episodes)
    rate = sum(v.passed for v in verdicts) / len(verdicts)
    return ScenarioResult(
        seeds=tuple(e.get("seed") for e in episodes),
        verdicts=verdicts,
        pass_rate=round(rate, 6),
        passed=rate + EPS >= threshold,
        collisions=sum(collided),
        at_fault=sum(faults),
        at_fault_by_seed=faults,
        collided_by_seed=collided,
        threshold=threshold,
    )
