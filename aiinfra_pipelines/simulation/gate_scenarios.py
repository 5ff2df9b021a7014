"""Why one scenario fails the gate on its own: new failures, regressed fixes, pass-rate drops.

Apart from the library-wide rules because the regression shard asks the same question
of each scenario before the gate runs (:func:`needs_confirmation`), to know which
verdicts to confirm on more seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .gate_comparison import STATUS_NEW_FAILURE, ScenarioComparison
from .gate_significance import beyond_chance, p_value_text
from .gate_verdicts import EPS, gate_section


def binding_fix(comparison: ScenarioComparison, section: Mapping[str, Any]) -> bool:
    """Whether an earlier version's fix of this scenario binds the candidate.

    It does, unless ``previously_fixed_must_pass`` is off or — with
    ``fixes_bind_only_where_the_oracle_passes`` — the oracle (ground-truth perception, the
    ceiling of this planner) fails the scenario on the same seeds: what the planner cannot
    pass with perfect perception is beyond any perception engine, and the earlier "fix" was a
    lucky draw of seeds. Likewise, with ``fixes_bind_only_while_the_fixer_passes``, when the
    version that fixed it is production and fails it itself on the same seeds. Such a scenario
    is still reported, and the comparison with production still applies to it.
    """
    if not comparison.first_fixed_by or not bool(section.get("previously_fixed_must_pass", True)):
        return False
    fixer_is_production = str(comparison.first_fixed_by) == str(comparison.production_version)
    if (
        bool(section.get("fixes_bind_only_while_the_fixer_passes", False))
        and fixer_is_production
        and not comparison.production_verdict.passed
    ):
        return False  # the version that "fixed" it fails it itself on these seeds
    oracle = comparison.oracle_verdict
    if bool(section.get("fixes_bind_only_where_the_oracle_passes", False)) and oracle:
        return oracle.passed
    return True


def needs_confirmation(
    comparison: ScenarioComparison,
    gates: Mapping[str, Any] | None = None,
    *,
    first_release: bool = False,
) -> bool:
    """Whether this scenario's verdict would fail the gate on its own: a new failure, a
    regressed fix or (against production) a pass-rate drop beyond tolerance.

    Such a scenario runs more seeds before the gate judges it (simulation.yaml
    ``episode.confirm_seeds``): with three seeds a scenario the candidate passes four times in
    five still fails one time in ten, and a library of dozens of fixed scenarios would refuse a
    good candidate almost every cycle. The extra seeds run for every planner, so the verdict —
    and the comparison with production — is over the pooled seeds.
    """
    section = gate_section(gates)
    # Every recorded fix counts here: whether the oracle passes the scenario is judged on the
    # pooled seeds, after confirmation.
    every_fix = {
        **section,
        "fixes_bind_only_where_the_oracle_passes": False,
        "fixes_bind_only_while_the_fixer_passes": False,
    }
    # Whether the pooled seeds put a regression beyond chance is judged after confirmation.
    return (
        scenario_failure(
            comparison, every_fix, first_release=first_release, require_significance=False
        )
        is not None
    )


def scenario_failure(
    comparison: ScenarioComparison,
    section: Mapping[str, Any],
    *,
    first_release: bool = False,
    require_significance: bool = True,
) -> str | None:
    """Why this scenario fails the gate on its own, or ``None``: a new failure, a binding
    regressed fix, or a pass-rate drop beyond tolerance. Before the first release (production
    is model zero) only a regressed fix counts. A new failure and a pass-rate drop compare with
    production, so they must also be beyond chance (:func:`beyond_chance`) unless
    ``require_significance`` is off (the confirmation predicate)."""
    c = comparison
    cand, prod = c.candidate_verdict, c.production_verdict
    why = "; ".join(cand.failures)
    beyond, p_value = beyond_chance(
        section,
        "scenario",
        cand.episodes - cand.passes,
        cand.episodes,
        prod.episodes - prod.passes,
        prod.episodes,
    )
    significant = beyond or not require_significance
    p_text = p_value_text(p_value) if require_significance else ""
    new_failures_gated = bool(section.get("no_new_failures", True))
    if not first_release and c.status == STATUS_NEW_FAILURE and new_failures_gated and significant:
        return (
            f"new failure {c.scenario_id}: production passes ({prod.describe()}), "
            f"candidate {cand.describe()}{p_text}: {why}"
        )
    if not cand.passed and binding_fix(c, section):
        return (
            f"regressed fix {c.scenario_id}: fixed by model version {c.first_fixed_by}, "
            f"candidate {cand.describe()}: {why}"
        )
    if first_release:
        return None
    max_drop = float(section["pass_rate"]["max_drop"])
    if cand.pass_rate < prod.pass_rate - max_drop - EPS and significant:
        return (
            f"pass rate drop {c.scenario_id}: candidate {cand.pass_rate:.2f} < production "
            f"{prod.pass_rate:.2f} - tolerance {max_drop:.2f}{p_text}: {why}"
        )
    return None
