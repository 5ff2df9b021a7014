"""The closed-loop regression gate: which scenarios pass, and may the candidate replace production.

Pure functions over per-episode metrics, thresholds from ``gates.yaml`` ``simulation:``:

* an *episode* passes when ego caused no collision (at-fault, as nuPlan counts it:
  :mod:`.collisions`; being rear-ended while stopped is no failure), the minimum
  time-to-collision stayed above its floor, hard brakes stayed within their count and the car
  made progress (per road type, with fnmatch overrides per scenario id);
* a *scenario* runs over several seeds (simulation.yaml ``episode.seeds_per_scenario``) and an
  engine's verdict on it is its pass rate; the engine passes the scenario when that rate
  reaches ``pass_rate.min_pass_rate``. One unlucky seed therefore does not flip a verdict, and
  the gate compares rates, not single rolls of the dice;
* the candidate passes the gate when no scenario that production passes fails for it (a *new
  failure*), its pass rate on no scenario falls more than ``pass_rate.max_drop`` below
  production's, no scenario an earlier model version fixed fails again, and its at-fault
  collision rate — the share of episodes, over the whole library and per slice — exceeds
  production's by no more than the budgets. The same engine as candidate and production (an
  A/A run) therefore always passes: its outcomes are identical;
* before the first release there is no production engine to regress against: production is
  model zero, which no car runs (its near-zero confidence makes the planner fall back on every
  frame — a car that only ever brakes to the lowest speed). Comparing against it would only ask
  "does the candidate drive as timidly as a car without perception". The first candidate is
  held to limits instead (``first_release``: the library's at-fault collision rate — an
  absolute limit, or the oracle's rate on the same episodes plus a margin where the oracle
  itself exceeds that limit — and per slice where configured); the per-scenario verdicts and
  production's numbers are still reported, and fixed scenarios must stay fixed;
* the oracle (ground-truth perception: the ceiling this planner reaches) and model zero (the
  floor) are judged and reported beside the two, never gated themselves; the oracle decides
  one thing: an earlier fix binds only where the oracle passes the scenario
  (``fixes_bind_only_where_the_oracle_passes``): what the planner fails with perfect
  perception no perception engine can be held to, and the "fix" was a lucky draw of seeds —
  as it was when the fixing version is production and fails the scenario on the same seeds
  (``fixes_bind_only_while_the_fixer_passes``);
* a verdict that would fail the gate is confirmed on more seeds first (simulation.yaml
  ``episode.confirm_seeds``, :func:`needs_confirmation`; the shard runs them);
* a regression *against production* — a new failure, a pass-rate drop, an at-fault rate over
  budget (library-wide or per slice) — counts only when it is also beyond chance on the pooled
  episodes (``regression_significance``: a one-sided Fisher exact test, :mod:`.significance`).
  Two engines of equal quality, each on its own seeds, split a borderline scenario's nine
  seeds 6-4 often enough that a threshold alone refuses an equal candidate most cycles;
  regressed fixes and the first-release limits are absolute and take no test.

Every failure is named, so the report (and certification after it) can say exactly why.

This module is the entry point (:func:`evaluate_gate`); the rules are split by what they
judge: ``gate_verdicts`` (one engine: episodes, scenarios), ``gate_comparison`` (engines
side by side), ``gate_scenarios`` (one scenario's failure), ``gate_significance``,
``gate_slices`` (rates and slices) and ``gate_first_release``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .gate_comparison import GateResult, compare_outcomes
from .gate_first_release import first_release_gate
from .gate_scenarios import scenario_failure
from .gate_significance import at_fault_beyond_chance, p_value_text
from .gate_slices import at_fault_rate_increase, judge_slices, role_rates
from .gate_verdicts import EPS, gate_section


def evaluate_gate(
    outcomes: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any] | None = None,
    *,
    first_release: bool = False,
    production_version: str | None = None,
) -> GateResult:
    """The regression gate over every simulated scenario; see the module docstring.

    ``first_release``: production is model zero (nothing released yet), so the absolute
    ``first_release`` limits replace the comparison with production. ``production_version``:
    which model version production is (a fix by that version is checked on its own episodes).
    """
    section = gate_section(gates)
    comparisons = compare_outcomes(outcomes, records, section, production_version)
    failures: list[str] = []
    if not comparisons:
        failures.append("no scenarios were simulated: an empty library proves nothing")
    if first_release:
        return first_release_gate(comparisons, section, failures)
    scenario_failures = {c.scenario_id: scenario_failure(c, section) for c in comparisons}
    failures += [f for f in scenario_failures.values() if f is not None]
    budgets = section.get("budgets") or {}
    aggregate = role_rates(comparisons)
    increase = at_fault_rate_increase(aggregate)
    budget = float(budgets.get("at_fault_rate", 0.0))
    aggregate["at_fault_rate_increase"] = round(increase, 6)
    aggregate["at_fault_rate_budget"] = budget
    beyond, p_value = at_fault_beyond_chance(aggregate, section)
    aggregate["at_fault_rate_increase_p"] = p_value
    aggregate["within_chance"] = [
        c.scenario_id
        for c in comparisons
        if scenario_failures[c.scenario_id] is None
        and scenario_failure(c, section, require_significance=False) is not None
    ]
    if comparisons and increase > budget + EPS and beyond:
        failures.append(
            f"at-fault collision rate {aggregate['candidate_at_fault_rate']:.3f} exceeds "
            f"production's {aggregate['production_at_fault_rate']:.3f} by {increase:.3f} > "
            f"budget {budget:.3f}{p_value_text(p_value)}"
        )
    slice_budget = float(budgets.get("slice_at_fault_rate", 0.0))
    return judge_slices(
        comparisons,
        section,
        aggregate,
        failures,
        limit=slice_budget,
        measure=at_fault_rate_increase,
        describe=lambda s: (
            f"slice {s['slice']}: at-fault collision rate {s['candidate_at_fault_rate']:.3f} "
            f"exceeds production's {s['production_at_fault_rate']:.3f} by "
            f"{at_fault_rate_increase(s):.3f} > budget {slice_budget:.3f}"
            f"{p_value_text(at_fault_beyond_chance(s, section)[1])}"
        ),
        significant=lambda s: at_fault_beyond_chance(s, section)[0],
    )
