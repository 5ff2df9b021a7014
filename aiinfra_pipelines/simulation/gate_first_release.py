"""The gate before the first release: absolute limits instead of a comparison.

With nothing released, production is model zero, which no car runs; comparing with it
would prove nothing, so the first candidate is held to ``first_release`` limits — a
separate rule set with its own settings, kept out of the comparison with production.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .gate_comparison import GateResult, ScenarioComparison
from .gate_scenarios import scenario_failure
from .gate_slices import judge_slices, role_rates
from .gate_verdicts import EPS


def first_release_gate(
    comparisons: Sequence[ScenarioComparison], section: Mapping[str, Any], failures: list[str]
) -> GateResult:
    """Absolute limits for a candidate when nothing has been released yet."""
    limits = section.get("first_release")
    if not limits:
        raise ValueError(
            "gates.yaml simulation.first_release is missing: it sets the absolute limits for a "
            "candidate when no engine has been released yet"
        )
    failures = [
        *failures,
        *(
            f
            for c in comparisons
            if (f := scenario_failure(c, section, first_release=True)) is not None
        ),
    ]
    aggregate = role_rates(comparisons)
    cap, reason = first_release_at_fault_limit(limits, aggregate.get("oracle_at_fault_rate"))
    aggregate["first_release"] = True
    aggregate["at_fault_rate_budget"] = cap
    aggregate["at_fault_rate_limit_from"] = reason
    if comparisons and aggregate["candidate_at_fault_rate"] > cap + EPS:
        failures.append(
            f"first release: at-fault collision rate {aggregate['candidate_at_fault_rate']:.3f} "
            f"exceeds the limit {cap:.3f} ({reason}; no production engine to compare with)"
        )
    slice_cap = limits.get("max_slice_at_fault_rate")
    return judge_slices(
        comparisons,
        section,
        aggregate,
        failures,
        limit=slice_cap,
        measure=lambda rates: rates["candidate_at_fault_rate"],
        describe=lambda s: (
            f"first release: slice {s['slice']} at-fault collision rate "
            f"{s['candidate_at_fault_rate']:.3f} exceeds the limit {float(slice_cap):.3f}"
        ),
    )


def first_release_at_fault_limit(
    limits: Mapping[str, Any], oracle_at_fault_rate: float | None
) -> tuple[float, str]:
    """The library-wide at-fault rate a first candidate may reach, and where it comes from.

    ``max_at_fault_rate`` is the absolute limit. Where the oracle (ground-truth perception,
    same scenarios and seeds) itself exceeds it, the library is harder than the limit for this
    planner, and an absolute cap would judge the planner and the dice, not perception: the
    limit is then the oracle's rate plus ``max_at_fault_rate_over_oracle`` — what perception
    may add to the collisions perfect perception already has. Never below the absolute limit.
    """
    cap = float(limits["max_at_fault_rate"])
    over_oracle = limits.get("max_at_fault_rate_over_oracle")
    if over_oracle is None or oracle_at_fault_rate is None:
        return cap, f"absolute limit {cap:.3f}"
    relative = float(oracle_at_fault_rate) + float(over_oracle)
    if relative <= cap:
        return cap, f"absolute limit {cap:.3f}"
    return relative, (
        f"the oracle's rate {float(oracle_at_fault_rate):.3f} on the same episodes "
        f"+ {float(over_oracle):.3f}"
    )
