"""Collision counts and rates per role, and judging them slice by slice.

Both gates — against production and the first-release limits — aggregate and judge
slices the same way, so the arithmetic and the per-slice rule live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .gate_comparison import GateResult, ScenarioComparison
from .gate_verdicts import EPS
from .roles import ROLE_CANDIDATE, ROLES


def judge_slices(
    comparisons: Sequence[ScenarioComparison],
    section: Mapping[str, Any],
    aggregate: dict[str, Any],
    failures: Sequence[str],
    *,
    limit: float | None,
    measure: Callable[[Mapping[str, Any]], float],
    describe: Callable[[Mapping[str, Any]], str],
    significant: Callable[[Mapping[str, Any]], bool] = lambda rates: True,
) -> GateResult:
    """Judge every slice (``measure(rates) <= limit``) and close the gate with the result.

    Both gates (against production, and the absolute first-release limits) judge slices the
    same way, so the rule lives once: a slice with fewer than ``min_slice_scenarios`` scenarios
    is reported but not gated (one collision in a noise-sized slice says nothing about the
    engine), and no ``limit`` means per-slice limits are not configured. Each failing slice
    adds ``describe(slice)`` after the library-wide ``failures``; ``budget`` records ``limit``
    as configured. A slice over its limit passes where ``significant`` says the excess is
    within chance (against production; the first-release limits are absolute).
    """
    min_scenarios = int(section.get("min_slice_scenarios", 1))
    slices = []
    for name in sorted({c.slice for c in comparisons}):
        rates = role_rates([c for c in comparisons if c.slice == name])
        gated = limit is not None and rates["scenarios"] >= min_scenarios
        passed = not gated or measure(rates) <= float(limit) + EPS or not significant(rates)
        slices.append({"slice": name, **rates, "gated": gated, "passed": passed, "budget": limit})
    failures = [*failures, *(describe(s) for s in slices if not s["passed"])]
    return GateResult(
        passed=not failures,
        failures=failures,
        comparisons=comparisons,
        aggregate=aggregate,
        slices=slices,
    )


def at_fault_rate_increase(rates: Mapping[str, Any]) -> float:
    """How much more often the candidate causes a collision than production (per episode)."""
    return rates["candidate_at_fault_rate"] - rates["production_at_fault_rate"]


def role_rates(comparisons: Sequence[ScenarioComparison]) -> dict[str, Any]:
    """Counts and rates per role: ``<role>_at_fault`` / ``<role>_collisions`` are episodes
    (scenario × seed) ending in an at-fault / any collision, ``<role>_passed`` scenarios
    passed, ``<role>_at_fault_rate`` the at-fault share of episodes. A role not driven on
    every scenario (oracle / model zero in an old report) reports ``None``."""
    n = len(comparisons)
    rates: dict[str, Any] = {"scenarios": n}
    for role in ROLES:
        results = [c.result(role) for c in comparisons]
        if any(r is None for r in results):
            for key in ("episodes", "at_fault", "collisions", "passed", "at_fault_scenarios"):
                rates[f"{role}_{key}"] = None
            rates[f"{role}_at_fault_rate"] = rates[f"{role}_collision_rate"] = None
            rates[f"{role}_mean_pass_rate"] = None
            continue
        results = [r for r in results if r is not None]  # (typing: none missing here)
        episodes = sum(r.episodes for r in results)
        at_fault_count = sum(r.at_fault for r in results)
        collisions = sum(r.collisions for r in results)
        rates[f"{role}_episodes"] = episodes
        rates[f"{role}_at_fault"] = at_fault_count
        rates[f"{role}_collisions"] = collisions
        rates[f"{role}_at_fault_scenarios"] = sum(r.at_fault > 0 for r in results)
        rates[f"{role}_at_fault_rate"] = round(at_fault_count / episodes, 6) if episodes else 0.0
        rates[f"{role}_collision_rate"] = round(collisions / episodes, 6) if episodes else 0.0
        rates[f"{role}_passed"] = sum(r.passed for r in results)
        rates[f"{role}_mean_pass_rate"] = (
            round(sum(r.pass_rate for r in results) / n, 6) if n else 0.0
        )
    rates["episodes"] = rates[f"{ROLE_CANDIDATE}_episodes"] or 0
    # Every scenario runs the configured seeds; those whose failing verdict was confirmed ran
    # more (simulation.yaml episode.confirm_seeds).
    seeds = [c.candidate_verdict.episodes for c in comparisons]
    rates["seeds_per_scenario"] = min(seeds, default=0)
    rates["confirmed_scenarios"] = sum(count > rates["seeds_per_scenario"] for count in seeds)
    return rates
