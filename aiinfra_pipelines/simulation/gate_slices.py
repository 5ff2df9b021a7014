"""At-fault collisions over the whole library and per slice: counts per planner, and the
paired tests of the candidate against its reference.

These tests read the first stage of seeds only — every engine drives those on every scenario,
and no scenario has more of them because it looked worse — so each scenario weighs the same
and the sample is the design's, not the sequential plan's. Pairs are pooled across scenarios:
each scenario × seed is its own stratum, and the Mantel–Haenszel test for matched pairs is the
exact McNemar test on the pooled discordant pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiinfra_pipelines.statistics.binomial import clopper_pearson
from aiinfra_pipelines.statistics.paired import PairedCounts, sign_test_p, tango_bound, total

from .gate_comparison import ScenarioComparison
from .gate_verdicts import AT_FAULT, paired_counts
from .roles import ROLE_CANDIDATE, ROLES

# Two-sided level of the confidence bounds a report shows beside the rates (90 %: each bound
# one-sided 95 %).
REPORT_BOUND_ALPHA = 0.05


def role_rates(comparisons: Sequence[ScenarioComparison]) -> dict[str, Any]:
    """Counts and rates per role: ``<role>_at_fault`` / ``<role>_collisions`` are episodes
    (scenario × seed) ending in an at-fault / any collision, ``<role>_passed`` scenarios
    passed, ``<role>_at_fault_rate`` the at-fault share of episodes with its exact 90 %
    interval. A role not driven on every scenario (an old report) reports ``None``."""
    n = len(comparisons)
    rates: dict[str, Any] = {"scenarios": n}
    for role in ROLES:
        results = [c.result(role) for c in comparisons]
        if any(r is None for r in results):
            for key in ("episodes", "at_fault", "collisions", "passed", "at_fault_scenarios"):
                rates[f"{role}_{key}"] = None
            rates[f"{role}_at_fault_rate"] = rates[f"{role}_collision_rate"] = None
            rates[f"{role}_mean_pass_rate"] = rates[f"{role}_at_fault_rate_bounds"] = None
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
        rates[f"{role}_at_fault_rate_bounds"] = [
            round(bound, 6)
            for bound in clopper_pearson(at_fault_count, episodes, 2 * REPORT_BOUND_ALPHA)
        ]
        rates[f"{role}_collision_rate"] = round(collisions / episodes, 6) if episodes else 0.0
        rates[f"{role}_passed"] = sum(r.passed for r in results)
        rates[f"{role}_mean_pass_rate"] = (
            round(sum(r.pass_rate for r in results) / n, 6) if n else 0.0
        )
    rates["episodes"] = rates[f"{ROLE_CANDIDATE}_episodes"] or 0
    rates["seeds_per_scenario"] = min(
        (c.candidate_verdict.episodes for c in comparisons), default=0
    )
    return rates


def pooled_at_fault(comparisons: Sequence[ScenarioComparison], reference: str) -> PairedCounts:
    """The candidate's at-fault episodes against ``reference``'s, paired by seed, pooled."""
    pairs = []
    for c in comparisons:
        other = c.result(reference)
        if other is not None:
            pairs.append(paired_counts(c.candidate_verdict, other, AT_FAULT))
    return total(pairs)


def difference_figures(counts: PairedCounts, prefix: str) -> dict[str, Any]:
    """A paired difference of at-fault rates as a report shows it: counts, estimate, the
    two-sided 90 % Tango bounds and the one-sided p-value of "the candidate is worse"."""
    return {
        f"{prefix}_pairs": counts.pairs,
        f"{prefix}_worse": counts.worse,
        f"{prefix}_better": counts.better,
        f"{prefix}_difference": round(counts.difference, 6),
        f"{prefix}_difference_bounds": [
            round(tango_bound(counts, REPORT_BOUND_ALPHA, upper=False), 6),
            round(tango_bound(counts, REPORT_BOUND_ALPHA, upper=True), 6),
        ],
        f"{prefix}_p": sign_test_p(counts.worse, counts.better),
    }


def library_at_fault_test(
    comparisons: Sequence[ScenarioComparison], reference: str, alpha: float
) -> tuple[dict[str, Any], str | None]:
    """(figures, failure or ``None``): is the candidate's library-wide at-fault rate worse
    than ``reference``'s beyond chance (exact McNemar on the pooled pairs, at ``alpha``)?"""
    counts = pooled_at_fault(comparisons, reference)
    figures = {**difference_figures(counts, "at_fault"), "at_fault_alpha": alpha}
    p_value = figures["at_fault_p"]
    if p_value > alpha:
        return figures, None
    return figures, (
        f"library: at-fault collision rate worse than {reference}'s: the candidate caused a "
        f"collision on {counts.worse} of {counts.pairs} paired episodes where {reference} did "
        f"not, {reference} on {counts.better} (difference {counts.difference:+.3f}; exact "
        f"McNemar p = {p_value:.2g} <= {alpha:.2g})"
    )


def slice_at_fault_tests(
    comparisons: Sequence[ScenarioComparison],
    reference: str | None,
    alpha: float,
    min_scenarios: int,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per slice: counts per role and, where the slice has at least ``min_scenarios``
    scenarios and a ``reference`` is given, the pooled at-fault test against it at
    ``alpha`` divided among the gated slices (Bonferroni)."""
    names = sorted({c.slice for c in comparisons})
    groups = {name: [c for c in comparisons if c.slice == name] for name in names}
    gated = [n for n in names if reference is not None and len(groups[n]) >= min_scenarios]
    level = alpha / len(gated) if gated else alpha
    slices, failures = [], []
    for name in names:
        entry: dict[str, Any] = {"slice": name, **role_rates(groups[name]), "gated": name in gated}
        entry["passed"] = True
        if name in gated and reference is not None:
            counts = pooled_at_fault(groups[name], reference)
            entry.update(difference_figures(counts, "at_fault"))
            entry["at_fault_level"] = level
            if entry["at_fault_p"] <= level:
                entry["passed"] = False
                failures.append(
                    f"slice {name}: at-fault collision rate worse than {reference}'s: "
                    f"{counts.worse} of {counts.pairs} paired episodes against {counts.better} "
                    f"(exact McNemar p = {entry['at_fault_p']:.2g} <= {level:.2g}, "
                    f"{len(gated)} gated slices)"
                )
        slices.append(entry)
    return slices, failures
