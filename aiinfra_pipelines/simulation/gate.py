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
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .roles import ROLE_CANDIDATE, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION, ROLES
from .settings import simulation_gates
from .significance import worse_by_chance_p

STATUS_PASS = "pass"
STATUS_NEW_FAILURE = "new_failure"
STATUS_REGRESSED_FIX = "regressed_fix"  # fixed by an earlier version, failing again
STATUS_FIXED = "fixed"  # production fails it, the candidate passes
STATUS_STILL_FAILING = "still_failing"
_EPS = 1e-9


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
    rate = sum(v.passed for v in verdicts) / len(verdicts)
    return ScenarioResult(
        seeds=tuple(e.get("seed") for e in episodes),
        verdicts=verdicts,
        pass_rate=round(rate, 6),
        passed=rate + _EPS >= threshold,
        collisions=sum(bool(e["collision"]) for e in episodes),
        at_fault=sum(at_fault(e) for e in episodes),
    )


@dataclass(frozen=True)
class ScenarioComparison:
    """One scenario's outcome for every engine, with verdicts and the resulting status.

    ``candidate`` / ``production`` (and ``oracle`` / ``model_zero`` when driven) are the
    per-seed episode metrics; the ``*_verdict`` fields judge them over the seeds.
    """

    scenario_id: str
    slice: str
    kind: str
    road_type: str
    candidate: Sequence[Mapping[str, Any]]
    production: Sequence[Mapping[str, Any]]
    candidate_verdict: ScenarioResult
    production_verdict: ScenarioResult
    first_fixed_by: str | None
    status: str
    oracle: Sequence[Mapping[str, Any]] = ()
    model_zero: Sequence[Mapping[str, Any]] = ()
    oracle_verdict: ScenarioResult | None = None
    model_zero_verdict: ScenarioResult | None = None
    production_version: str | None = None  # the model version production is, when known

    def result(self, role: str) -> ScenarioResult | None:
        return getattr(self, f"{role}_verdict")


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
    production_version: str | None = None,
) -> list[ScenarioComparison]:
    """Verdicts for every outcome row (``scenario_id``, ``slice``, ``kind``, ``road_type``, and
    per role — ``candidate``, ``production``, optionally ``oracle`` and ``model_zero`` — the
    episodes, one per seed); ``records`` are the library's first-failed / first-fixed records
    by scenario id."""
    section = gate_section(gates)
    threshold = min_pass_rate(section)
    comparisons = []
    for row in sorted(outcomes, key=lambda r: r["scenario_id"]):
        criteria = scenario_criteria(row["scenario_id"], section)
        episodes = {role: episodes_of(row.get(role)) for role in ROLES}
        results = {
            role: scenario_result(runs, row["road_type"], criteria, threshold) if runs else None
            for role, runs in episodes.items()
        }
        candidate, production = results[ROLE_CANDIDATE], results[ROLE_PRODUCTION]
        if candidate is None or production is None:
            raise ValueError(f"scenario {row['scenario_id']}: candidate and production needed")
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
                candidate=episodes[ROLE_CANDIDATE],
                production=episodes[ROLE_PRODUCTION],
                candidate_verdict=candidate,
                production_verdict=production,
                first_fixed_by=fixed_by,
                status=status,
                oracle=episodes[ROLE_ORACLE],
                model_zero=episodes[ROLE_MODEL_ZERO],
                oracle_verdict=results[ROLE_ORACLE],
                model_zero_verdict=results[ROLE_MODEL_ZERO],
                production_version=production_version,
            )
        )
    return comparisons


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
        return _first_release_gate(comparisons, section, failures)
    scenario_failures = {c.scenario_id: scenario_failure(c, section) for c in comparisons}
    failures += [f for f in scenario_failures.values() if f is not None]
    budgets = section.get("budgets") or {}
    aggregate = _rates(comparisons)
    increase = _at_fault_rate_increase(aggregate)
    budget = float(budgets.get("at_fault_rate", 0.0))
    aggregate["at_fault_rate_increase"] = round(increase, 6)
    aggregate["at_fault_rate_budget"] = budget
    beyond, p_value = _at_fault_beyond_chance(aggregate, section)
    aggregate["at_fault_rate_increase_p"] = p_value
    aggregate["within_chance"] = [
        c.scenario_id
        for c in comparisons
        if scenario_failures[c.scenario_id] is None
        and scenario_failure(c, section, require_significance=False) is not None
    ]
    if comparisons and increase > budget + _EPS and beyond:
        failures.append(
            f"at-fault collision rate {aggregate['candidate_at_fault_rate']:.3f} exceeds "
            f"production's {aggregate['production_at_fault_rate']:.3f} by {increase:.3f} > "
            f"budget {budget:.3f}{_p_text(p_value)}"
        )
    slice_budget = float(budgets.get("slice_at_fault_rate", 0.0))
    return _judge_slices(
        comparisons,
        section,
        aggregate,
        failures,
        limit=slice_budget,
        measure=_at_fault_rate_increase,
        describe=lambda s: (
            f"slice {s['slice']}: at-fault collision rate {s['candidate_at_fault_rate']:.3f} "
            f"exceeds production's {s['production_at_fault_rate']:.3f} by "
            f"{_at_fault_rate_increase(s):.3f} > budget {slice_budget:.3f}"
            f"{_p_text(_at_fault_beyond_chance(s, section)[1])}"
        ),
        significant=lambda s: _at_fault_beyond_chance(s, section)[0],
    )


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
    return p_value <= alpha + _EPS, p_value


def _at_fault_beyond_chance(
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


def _p_text(p_value: float | None) -> str:
    return "" if p_value is None else f" (p = {p_value:.3f} that equal engines differ so)"


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
    p_text = _p_text(p_value) if require_significance else ""
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
    if cand.pass_rate < prod.pass_rate - max_drop - _EPS and significant:
        return (
            f"pass rate drop {c.scenario_id}: candidate {cand.pass_rate:.2f} < production "
            f"{prod.pass_rate:.2f} - tolerance {max_drop:.2f}{p_text}: {why}"
        )
    return None


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
    failures = [
        *failures,
        *(
            f
            for c in comparisons
            if (f := scenario_failure(c, section, first_release=True)) is not None
        ),
    ]
    aggregate = _rates(comparisons)
    cap, reason = first_release_at_fault_limit(limits, aggregate.get("oracle_at_fault_rate"))
    aggregate["first_release"] = True
    aggregate["at_fault_rate_budget"] = cap
    aggregate["at_fault_rate_limit_from"] = reason
    if comparisons and aggregate["candidate_at_fault_rate"] > cap + _EPS:
        failures.append(
            f"first release: at-fault collision rate {aggregate['candidate_at_fault_rate']:.3f} "
            f"exceeds the limit {cap:.3f} ({reason}; no production engine to compare with)"
        )
    slice_cap = limits.get("max_slice_at_fault_rate")
    return _judge_slices(
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


def _judge_slices(
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
        rates = _rates([c for c in comparisons if c.slice == name])
        gated = limit is not None and rates["scenarios"] >= min_scenarios
        passed = not gated or measure(rates) <= float(limit) + _EPS or not significant(rates)
        slices.append({"slice": name, **rates, "gated": gated, "passed": passed, "budget": limit})
    failures = [*failures, *(describe(s) for s in slices if not s["passed"])]
    return GateResult(
        passed=not failures,
        failures=failures,
        comparisons=comparisons,
        aggregate=aggregate,
        slices=slices,
    )


def _at_fault_rate_increase(rates: Mapping[str, Any]) -> float:
    """How much more often the candidate causes a collision than production (per episode)."""
    return rates["candidate_at_fault_rate"] - rates["production_at_fault_rate"]


def _rates(comparisons: Sequence[ScenarioComparison]) -> dict[str, Any]:
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
