"""When a regression against production counts: beyond chance at the configured level.

The statistics live in :mod:`.significance`; this module holds the gate's use of them —
which significance level applies to which family of verdicts, and how a p-value reads in
a failure message — shared by the per-scenario and the at-fault rate rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .gate_verdicts import EPS
from .significance import worse_by_chance_p


def regression_alpha(section: Mapping[str, Any], family: str) -> float | None:
    """``regression_significance.<family>``: the p-value at or below which a regression against
    production is beyond chance — ``scenario`` for per-scenario verdicts (a library tests
    dozens, so it is stricter), ``rate`` for at-fault rates library-wide and per slice.
    ``None`` (absent) judges by the thresholds alone."""
    levels = section.get("regression_significance") or {}
    value = levels.get(family)
    return None if value is None else float(value)


def beyond_chance(
    section: Mapping[str, Any],
    family: str,
    candidate_bad: int,
    candidate_n: int,
    prod_bad: int,
    prod_n: int,
) -> tuple[bool, float | None]:
    """Whether the candidate's excess of bad episodes over production's is beyond chance,
    and the p-value (``None`` when no significance level is configured: always beyond)."""
    alpha = regression_alpha(section, family)
    if alpha is None:
        return True, None
    p_value = round(worse_by_chance_p(candidate_bad, candidate_n, prod_bad, prod_n), 6)
    return p_value <= alpha + EPS, p_value


def at_fault_beyond_chance(
    rates: Mapping[str, Any], section: Mapping[str, Any]
) -> tuple[bool, float | None]:
    return beyond_chance(
        section,
        "rate",
        int(rates["candidate_at_fault"] or 0),
        int(rates["candidate_episodes"] or 0),
        int(rates["production_at_fault"] or 0),
        int(rates["production_episodes"] or 0),
    )


def p_value_text(p_value: float | None) -> str:
    return "" if p_value is None else f" (p = {p_value:.3f} that equal engines differ so)"
