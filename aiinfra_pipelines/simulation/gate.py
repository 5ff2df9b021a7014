"""The closed-loop regression gate: which scenarios pass, and may the candidate replace production.

Pure functions over per-scenario metrics, thresholds from ``gates.yaml`` ``simulation:``:

* a scenario passes when no collision happened, the minimum time-to-collision stayed above its
  floor, hard brakes stayed within their count and the car made progress (per road type, with
  fnmatch overrides per scenario id);
* the candidate passes the gate when no scenario that production passes fails for it (a *new
  failure*), no scenario an earlier model version fixed fails again, and its collision rate —
  over the whole library and per slice — exceeds production's by no more than the budgets;
* before the first release there is no production engine to regress against: production is
  model zero, which no car runs (its near-zero confidence makes the planner fall back on every
  frame — a car that only ever brakes to the lowest speed). Comparing against it would only ask
  "does the candidate drive as timidly as a car without perception". The first candidate is
  held to absolute limits instead (``first_release``: the library's collision rate, and per
  slice where configured); the per-scenario verdicts and production's numbers are still
  reported, and fixed scenarios must stay fixed.

Every failure is named, so the report (and certification after it) can say exactly why.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .settings import simulation_gates

STATUS_PASS = "pass"
STATUS_NEW_FAILURE = "new_failure"
STATUS_REGRESSED_FIX = "regressed_fix"  # fixed by an earlier version, failing again
STATUS_FIXED = "fixed"  # production fails it, the candidate passes
STATUS_STILL_FAILING = "still_failing"


@dataclass(frozen=True)
class Verdict:
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


def scenario_verdict(
    metrics: Mapping[str, Any], road_type: str, criteria: Mapping[str, Any]
) -> Verdict:
    """Whether one episode passes; ``failures`` says which criteria it broke and by how much."""
    failures = []
    if criteria.get("no_collision", True) and metrics["collision"]:
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
class ScenarioComparison:
    """One scenario's outcome for both engines, with verdicts and the resulting status."""

    scenario_id: str
    slice: str
    kind: str
    road_type: str
    candidate: Mapping[str, Any]
    production: Mapping[str, Any]
    candidate_verdict: Verdict
    production_verdict: Verdict
    first_fixed_by: str | None
    status: str


@dataclass
class GateResult:
    passed: bool
    failures: list[str]
    comparisons: list[ScenarioComparison]
    aggregate: dict[str, Any]
    slices: list[dict[str, Any]] = field(default_factory=list)


def compare_outcomes(
    outcomes: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any] | None = None,
) -> list[ScenarioComparison]:
    """Verdicts for every outcome row (``scenario_id``, ``slice``, ``kind``, ``road_type``,
    ``candidate`` and ``production`` metrics); ``records`` are the library's first-failed /
    first-fixed records by scenario id."""
    section = gate_section(gates)
    comparisons = []
    for row in sorted(outcomes, key=lambda r: r["scenario_id"]):
        criteria = scenario_criteria(row["scenario_id"], section)
        candidate = scenario_verdict(row["candidate"], row["road_type"], criteria)
        production = scenario_verdict(row["production"], row["road_type"], criteria)
        fixed_by = (records.get(row["scenario_id"]) or {}).get("first_fixed_by")
        if candidate.passed:
            status = STATUS_PASS if production.passed else STATUS_FIXED
        elif production.passed:
            status = STATUS_NEW_FAILURE
        elif fixed_by:
            status = STATUS_REGRESSED_FIX
        else:
            status = STATUS_STILL_FAILING
        comparisons.append(
            ScenarioComparison(
                scenario_id=row["scenario_id"],
                slice=row["slice"],
                kind=row["kind"],
                road_type=row["road_type"],
                candidate=row["candidate"],
                production=row["production"],
                candidate_verdict=candidate,
                production_verdict=production,
                first_fixed_by=fixed_by,
                status=status,
            )
        )
    return comparisons


def evaluate_gate(
    outcomes: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any] | None = None,
    *,
    first_release: bool = False,
) -> GateResult:
    """The regression gate over every simulated scenario; see the module docstring.

    ``first_release``: production is model zero (nothing released yet), so the absolute
    ``first_release`` limits replace the comparison with production.
    """
    section = gate_section(gates)
    comparisons = compare_outcomes(outcomes, records, section)
    failures: list[str] = []
    if not comparisons:
        failures.append("no scenarios were simulated: an empty library proves nothing")
    if first_release:
        return _first_release_gate(comparisons, section, failures)
    no_new_failures = bool(section.get("no_new_failures", True))
    keep_fixes = bool(section.get("previously_fixed_must_pass", True))
    for c in comparisons:
        if c.candidate_verdict.passed:
            continue
        why = "; ".join(c.candidate_verdict.failures)
        if c.status == STATUS_NEW_FAILURE and no_new_failures:
            failures.append(f"new failure {c.scenario_id}: production passes, candidate: {why}")
        elif c.first_fixed_by and keep_fixes:
            failures.append(
                f"regressed fix {c.scenario_id}: fixed by model version {c.first_fixed_by}, "
                f"candidate: {why}"
            )
    budgets = section.get("budgets") or {}
    aggregate = _rates(comparisons)
    increase = _collision_rate_increase(aggregate)
    budget = float(budgets.get("collision_rate", 0.0))
    aggregate["collision_rate_increase"] = round(increase, 6)
    aggregate["collision_rate_budget"] = budget
    if comparisons and increase > budget + 1e-12:
        failures.append(
            f"collision rate {aggregate['candidate_collision_rate']:.3f} exceeds production's "
            f"{aggregate['production_collision_rate']:.3f} by {increase:.3f} > budget {budget:.3f}"
        )
    slice_budget = float(budgets.get("slice_collision_rate", 0.0))
    return _judge_slices(
        comparisons,
        section,
        aggregate,
        failures,
        limit=slice_budget,
        measure=_collision_rate_increase,
        describe=lambda s: (
            f"slice {s['slice']}: collision rate {s['candidate_collision_rate']:.3f} exceeds "
            f"production's {s['production_collision_rate']:.3f} by "
            f"{_collision_rate_increase(s):.3f} > budget {slice_budget:.3f}"
        ),
    )


def _regressed_fixes(
    comparisons: Sequence[ScenarioComparison], section: Mapping[str, Any]
) -> list[str]:
    if not bool(section.get("previously_fixed_must_pass", True)):
        return []
    return [
        f"regressed fix {c.scenario_id}: fixed by model version {c.first_fixed_by}, candidate: "
        + "; ".join(c.candidate_verdict.failures)
        for c in comparisons
        if not c.candidate_verdict.passed and c.first_fixed_by
    ]


def _first_release_gate(
    comparisons: Sequence[ScenarioComparison], section: Mapping[str, Any], failures: list[str]
) -> GateResult:
    """Absolute limits for a candidate when nothing has been released yet."""
    limits = section.get("first_release")
    if not limits:
        raise ValueError(
            "gates.yaml simulation.first_release is missing: it sets the absolute limits for a "
            "candidate when no engine has been released yet"
        )
    failures = [*failures, *_regressed_fixes(comparisons, section)]
    aggregate = _rates(comparisons)
    cap = float(limits["max_collision_rate"])
    aggregate["first_release"] = True
    aggregate["collision_rate_budget"] = cap
    if comparisons and aggregate["candidate_collision_rate"] > cap + 1e-12:
        failures.append(
            f"first release: collision rate {aggregate['candidate_collision_rate']:.3f} "
            f"exceeds the absolute limit {cap:.3f} (no production engine to compare with)"
        )
    slice_cap = limits.get("max_slice_collision_rate")
    return _judge_slices(
        comparisons,
        section,
        aggregate,
        failures,
        limit=slice_cap,
        measure=lambda rates: rates["candidate_collision_rate"],
        describe=lambda s: (
            f"first release: slice {s['slice']} collision rate "
            f"{s['candidate_collision_rate']:.3f} exceeds the limit {float(slice_cap):.3f}"
        ),
    )


def _judge_slices(
    comparisons: Sequence[ScenarioComparison],
    section: Mapping[str, Any],
    aggregate: dict[str, Any],
    failures: Sequence[str],
    *,
    limit: float | None,
    measure: Callable[[Mapping[str, Any]], float],
    describe: Callable[[Mapping[str, Any]], str],
) -> GateResult:
    """Judge every slice (``measure(rates) <= limit``) and close the gate with the result.

    Both gates (against production, and the absolute first-release limits) judge slices the
    same way, so the rule lives once: a slice with fewer than ``min_slice_scenarios`` scenarios
    is reported but not gated (one collision in a noise-sized slice says nothing about the
    engine), and no ``limit`` means per-slice limits are not configured. Each failing slice
    adds ``describe(slice)`` after the library-wide ``failures``; ``budget`` records ``limit``
    as configured.
    """
    min_scenarios = int(section.get("min_slice_scenarios", 1))
    slices = []
    for name in sorted({c.slice for c in comparisons}):
        rates = _rates([c for c in comparisons if c.slice == name])
        gated = limit is not None and rates["scenarios"] >= min_scenarios
        passed = not gated or measure(rates) <= float(limit) + 1e-12
        slices.append({"slice": name, **rates, "gated": gated, "passed": passed, "budget": limit})
    failures = [*failures, *(describe(s) for s in slices if not s["passed"])]
    return GateResult(
        passed=not failures,
        failures=failures,
        comparisons=comparisons,
        aggregate=aggregate,
        slices=slices,
    )


def _collision_rate_increase(rates: Mapping[str, Any]) -> float:
    """How much more often the candidate collides than production (negative: less often)."""
    return rates["candidate_collision_rate"] - rates["production_collision_rate"]


def _rates(comparisons: Sequence[ScenarioComparison]) -> dict[str, Any]:
    n = len(comparisons)
    candidate = sum(bool(c.candidate["collision"]) for c in comparisons)
    production = sum(bool(c.production["collision"]) for c in comparisons)
    return {
        "scenarios": n,
        "candidate_collisions": candidate,
        "production_collisions": production,
        "candidate_collision_rate": round(candidate / n, 6) if n else 0.0,
        "production_collision_rate": round(production / n, 6) if n else 0.0,
        "candidate_passed": sum(c.candidate_verdict.passed for c in comparisons),
        "production_passed": sum(c.production_verdict.passed for c in comparisons),
    }
