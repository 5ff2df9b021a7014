"""The regression gate on hand-built outcomes: what passes an episode and a scenario (pass rate
over seeds), and when a candidate is refused (new failures, pass-rate drops, regressed fixes,
at-fault collision budgets in total and per slice)."""

from __future__ import annotations

import copy

import pytest

from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.gate_comparison import (
    STATUS_FIXED,
    STATUS_NEW_FAILURE,
    STATUS_PASS,
    STATUS_STILL_FAILING,
    compare_outcomes,
)
from aiinfra_pipelines.simulation.gate_scenarios import needs_confirmation
from aiinfra_pipelines.simulation.gate_verdicts import (
    gate_section,
    scenario_criteria,
    scenario_verdict,
)
from aiinfra_pipelines.simulation.significance import worse_by_chance_p
from aiinfra_pipelines_tests.support.noisy_library import certify_rate

from .test_library import GATES


def m(collision=False, ttc=None, brakes=0, progress=80.0, duration=4.0, at_fault=None, seed=None):
    """One episode's metrics; a collision is at fault unless ``at_fault=False`` says otherwise."""
    metrics = {
        "collision": collision,
        "collision_step": 2 if collision else None,
        "min_ttc_s": ttc,
        "hard_brakes": brakes,
        "progress_m": progress,
        "duration_s": duration,
        "seed": seed,
    }
    if collision and at_fault is not None:
        metrics["at_fault_collision"] = at_fault
        metrics["collision_type"] = "active_front" if at_fault else "active_rear"
    return metrics


def seeds(*episodes):
    """Per-seed episodes of one engine on one scenario (seeds numbered from 0)."""
    return [{**e, "seed": i} for i, e in enumerate(episodes)]


def row(scenario_id, candidate, production, slice_="day/clear/highway", road="highway", **more):
    return {
        "scenario_id": scenario_id,
        "slice": slice_,
        "kind": "base",
        "road_type": road,
        "candidate": candidate,
        "production": production,
        **more,
    }


def gates(**changes):
    section = copy.deepcopy(GATES)
    for key, value in changes.items():
        section[key] = value
    return section


def test_scenario_criteria_and_overrides():
    criteria = GATES["scenario_pass"]
    assert scenario_verdict(m(), "highway", criteria).passed
    assert scenario_verdict(m(collision=True), "highway", criteria).failures == (
        "at-fault collision (unclassified) at step 2",
    )
    assert "min TTC 0.50 s < 0.75 s" in scenario_verdict(m(ttc=0.5), "highway", criteria).failures
    assert "5 hard brakes > 4" in scenario_verdict(m(brakes=5), "highway", criteria).failures
    assert scenario_verdict(m(progress=40.0), "highway", criteria).failures == (
        "progress 10.0 m/s < 15.0 m/s",
    )
    with pytest.raises(KeyError, match="min_progress_mps has no 'merge'"):
        scenario_verdict(m(), "merge", criteria)
    section = gates(scenario_overrides={"slow_*": {"min_progress_mps": 5.0}})
    assert scenario_criteria("slow_lead-1", section)["min_progress_mps"] == 5.0
    assert scenario_criteria("cruise", section)["min_progress_mps"] == {"highway": 15.0}
    assert scenario_verdict(
        m(progress=40.0), "highway", scenario_criteria("slow_x", section)
    ).passed


def test_a_collision_ego_did_not_cause_is_no_failure():
    criteria = GATES["scenario_pass"]
    rear_ended = m(collision=True, at_fault=False)
    assert scenario_verdict(rear_ended, "highway", criteria).passed
    assert scenario_verdict(m(collision=True, at_fault=True), "highway", criteria).failures == (
        "at-fault collision (active_front) at step 2",
    )
    # A gate that wants no collision at all can still say so.
    strict = {**criteria, "no_collision": True}
    assert not scenario_verdict(rear_ended, "highway", strict).passed


def test_the_repository_gates_are_complete():
    section = gate_section()
    for road in ("highway", "merge", "roundabout", "intersection"):
        assert road in section["scenario_pass"]["min_progress_mps"]
    assert section["no_new_failures"] is True
    assert section["scenario_pass"]["no_at_fault_collision"] is True
    assert 0.0 < section["pass_rate"]["min_pass_rate"] <= 1.0
    assert section["first_release"]["max_at_fault_rate"] is not None


def test_candidate_failing_what_production_passes_is_refused():
    result = evaluate_gate([row("a", m(collision=True), m()), row("b", m(), m())], {}, GATES)
    assert not result.passed
    statuses = {c.scenario_id: c.status for c in result.comparisons}
    assert statuses == {"a": STATUS_NEW_FAILURE, "b": STATUS_PASS}
    assert result.failures[0] == (
        "new failure a: production passes (1/1 seeds pass), candidate 0/1 seeds pass: "
        "seed None: at-fault collision (unclassified) at step 2"
    )
    assert result.aggregate["candidate_at_fault_rate"] == 0.5
    assert (
        result.aggregate["candidate_at_fault"] == 1 and result.aggregate["production_at_fault"] == 0
    )


def test_improvements_pass():
    result = evaluate_gate(
        [row("a", m(), m(collision=True)), row("b", m(), m(progress=10.0)), row("c", m(), m())],
        {},
        GATES,
    )
    assert result.passed, result.failures
    statuses = {c.scenario_id: c.status for c in result.comparisons}
    assert statuses == {"a": STATUS_FIXED, "b": STATUS_FIXED, "c": STATUS_PASS}
    assert result.aggregate["candidate_passed"] == 3 and result.aggregate["production_passed"] == 1


def test_failing_where_production_also_fails_is_tolerated_unless_it_causes_more_collisions():
    tolerated = evaluate_gate([row("a", m(progress=10.0), m(progress=12.0))], {}, GATES)
    assert tolerated.passed
    assert tolerated.comparisons[0].status == STATUS_STILL_FAILING
    worse = evaluate_gate([row("a", m(collision=True), m(progress=12.0))], {}, GATES)
    assert not worse.passed
    assert any(
        f.startswith("at-fault collision rate 1.000 exceeds production's 0.000")
        for f in worse.failures
    )


def test_collisions_production_did_not_cause_do_not_count_against_it_either():
    """Rear-ended production and an at-fault candidate: the candidate collides more."""
    rows = [row("a", m(collision=True, at_fault=True), m(collision=True, at_fault=False))]
    result = evaluate_gate(rows, {}, GATES)
    assert result.comparisons[0].status == STATUS_NEW_FAILURE
    assert result.aggregate["candidate_collisions"] == result.aggregate["production_collisions"]
    assert result.aggregate["production_at_fault"] == 0


def test_a_scenario_verdict_is_its_pass_rate_over_seeds():
    """One unlucky seed of three does not fail a scenario; two do."""
    one_bad = seeds(m(), m(collision=True), m())
    two_bad = seeds(m(collision=True), m(), m(collision=True))
    clean = seeds(m(), m(), m())
    result = evaluate_gate(
        [row("a", one_bad, clean), row("b", clean, clean)],
        {},
        gates(budgets={"at_fault_rate": 0.2, "slice_at_fault_rate": 0.2}),
    )
    assert result.passed, result.failures
    a = result.comparisons[0]
    assert a.candidate_verdict.pass_rate == pytest.approx(2 / 3, abs=1e-6)
    assert a.candidate_verdict.passed and a.status == STATUS_PASS
    assert a.candidate_verdict.failures == ("seed 1: at-fault collision (unclassified) at step 2",)
    assert result.aggregate["episodes"] == 6 and result.aggregate["seeds_per_scenario"] == 3
    assert result.aggregate["candidate_at_fault"] == 1

    refused = evaluate_gate([row("a", two_bad, clean)], {}, gates())
    assert refused.comparisons[0].status == STATUS_NEW_FAILURE
    assert refused.failures[0].startswith(
        "new failure a: production passes (3/3 seeds pass), candidate 1/3 seeds pass"
    )


def test_the_pass_rate_may_not_drop_beyond_tolerance_even_where_production_fails():
    production = seeds(m(), m(collision=True, at_fault=True), m(progress=1.0))  # 1/3: fails
    candidate = seeds(m(progress=1.0), m(progress=1.0), m(progress=1.0))  # 0/3
    tolerant = gates(pass_rate={"min_pass_rate": 0.66, "max_drop": 0.34})
    assert evaluate_gate([row("a", candidate, production)], {}, tolerant).passed
    strict = gates(pass_rate={"min_pass_rate": 0.66, "max_drop": 0.2})
    result = evaluate_gate([row("a", candidate, production)], {}, strict)
    assert result.failures == [
        "pass rate drop a: candidate 0.00 < production 0.33 - tolerance 0.20: "
        "seed 0: progress 0.2 m/s < 15.0 m/s; seed 1: progress 0.2 m/s < 15.0 m/s; "
        "seed 2: progress 0.2 m/s < 15.0 m/s"
    ]


def test_the_same_outcomes_for_candidate_and_production_always_pass():
    """An A/A comparison on hand-built outcomes, failures and collisions included."""
    episodes = [
        seeds(m(), m(collision=True), m()),
        seeds(m(progress=1.0), m(progress=1.0), m(collision=True)),
        seeds(m(collision=True, at_fault=False), m(), m(brakes=9)),
    ]
    rows = [
        row(f"s{i}", e, copy.deepcopy(e), slice_=f"day/clear/{i}") for i, e in enumerate(episodes)
    ]
    result = evaluate_gate(rows, {}, gates(pass_rate={"min_pass_rate": 1.0, "max_drop": 0.0}))
    assert result.passed, result.failures
    assert result.aggregate["at_fault_rate_increase"] == 0.0


def test_oracle_and_model_zero_are_reported_not_gated():
    rows = [
        row("a", m(), m(), oracle=m(), model_zero=m(collision=True)),
        row("b", m(), m(), oracle=m(collision=True, at_fault=False), model_zero=m(progress=1.0)),
    ]
    result = evaluate_gate(rows, {}, GATES)
    assert result.passed
    aggregate = result.aggregate
    assert aggregate["oracle_at_fault"] == 0 and aggregate["oracle_collisions"] == 1
    assert aggregate["model_zero_at_fault"] == 1 and aggregate["model_zero_passed"] == 0
    assert result.comparisons[0].result("model_zero").at_fault == 1
    # Without them (an older report) the figures are absent, not zero.
    plain = evaluate_gate([row("a", m(), m())], {}, GATES)
    assert plain.aggregate["oracle_at_fault"] is None


def test_slice_budget_catches_what_the_total_hides():
    rows = [
        row("n1", m(collision=True), m(progress=1.0), slice_="night/fog/highway"),
        row("d1", m(), m(), slice_="day/clear/highway"),
        row("d2", m(), m(), slice_="day/clear/highway"),
        row("d3", m(), m(), slice_="day/clear/highway"),
    ]
    section = gates(budgets={"at_fault_rate": 0.5, "slice_at_fault_rate": 0.0})
    result = evaluate_gate(rows, {}, section)
    assert not result.passed
    assert result.failures == [
        "slice night/fog/highway: at-fault collision rate 1.000 exceeds production's 0.000 by "
        "1.000 > budget 0.000"
    ]
    # Slices with fewer scenarios than min_slice_scenarios are reported, not gated.
    lenient = evaluate_gate(rows, {}, {**section, "min_slice_scenarios": 2})
    assert lenient.passed
    night = next(s for s in lenient.slices if s["slice"] == "night/fog/highway")
    assert night["gated"] is False and night["candidate_at_fault"] == 1


def test_previously_fixed_scenario_must_keep_passing():
    rows = [row("a", m(collision=True), m(collision=True))]
    records = {"a": {"first_failed_by": "p0", "first_fixed_by": "4"}}
    result = evaluate_gate(rows, records, GATES)
    assert not result.passed
    assert result.failures[0].startswith("regressed fix a: fixed by model version 4")
    assert evaluate_gate(rows, records, gates(previously_fixed_must_pass=False)).passed


def test_nothing_simulated_proves_nothing():
    result = evaluate_gate([], {}, GATES)
    assert not result.passed and "no scenarios were simulated" in result.failures[0]


def test_first_release_is_held_to_absolute_limits_not_to_model_zero():
    """Model zero passes by never driving fast; before any release the gate ignores it."""
    section = {**GATES, "first_release": {"max_at_fault_rate": 0.5}}
    rows = [row("a", m(collision=True), m()), row("b", m(), m()), row("c", m(), m())]
    compared = evaluate_gate(rows, {}, section)
    assert not compared.passed and any(f.startswith("new failure a") for f in compared.failures)

    first = evaluate_gate(rows, {}, section, first_release=True)
    assert first.passed, first.failures
    assert first.aggregate["first_release"] is True
    assert first.aggregate["candidate_at_fault_rate"] == round(1 / 3, 6)

    strict = {**GATES, "first_release": {"max_at_fault_rate": 0.2}}
    refused = evaluate_gate(rows, {}, strict, first_release=True)
    assert not refused.passed
    assert any("exceeds the limit 0.200 (absolute limit" in f for f in refused.failures)


def test_first_release_counts_only_collisions_the_candidate_caused():
    strict = {**GATES, "first_release": {"max_at_fault_rate": 0.0}}
    rear_ended = [row("a", m(collision=True, at_fault=False), m())]
    assert evaluate_gate(rear_ended, {}, strict, first_release=True).passed
    at_fault = [row("a", m(collision=True, at_fault=True), m())]
    assert not evaluate_gate(at_fault, {}, strict, first_release=True).passed


def test_first_release_still_keeps_fixed_scenarios_fixed_and_needs_its_limits():
    rows = [row("a", m(collision=True), m(collision=True))]
    records = {"a": {"first_fixed_by": "3"}}
    section = {**GATES, "first_release": {"max_at_fault_rate": 1.0}}
    result = evaluate_gate(rows, records, section, first_release=True)
    assert any(f.startswith("regressed fix a") for f in result.failures)
    without = {key: value for key, value in GATES.items() if key != "first_release"}
    with pytest.raises(ValueError, match="first_release is missing"):
        evaluate_gate(rows, {}, without, first_release=True)


def test_only_verdicts_that_would_fail_the_gate_are_confirmed_on_more_seeds():
    clean, one_pass = seeds(m(), m(), m()), seeds(m(collision=True), m(), m(collision=True))
    records = {"fixed": {"first_failed_by": "0", "first_fixed_by": "1"}}
    rows = [
        row("new", one_pass, clean),  # new failure
        row("fixed", one_pass, one_pass),  # regressed fix, though production fails it too
        row("both", one_pass, one_pass),  # still failing, nothing fixed: tolerated
        row("fine", clean, clean),
        row("drop", seeds(m(progress=1.0), m(progress=1.0), m(progress=1.0)), one_pass),
    ]
    strict = gates(pass_rate={"min_pass_rate": 0.66, "max_drop": 0.2})
    comparisons = {c.scenario_id: c for c in compare_outcomes(rows, records, strict)}
    assert {sid for sid, c in comparisons.items() if needs_confirmation(c, strict)} == {
        "new",
        "fixed",
        "drop",
    }
    # Before the first release only fixes bind a scenario (production is model zero).
    assert {
        sid for sid, c in comparisons.items() if needs_confirmation(c, strict, first_release=True)
    } == {"fixed"}
    without_fixes = gates(previously_fixed_must_pass=False)
    assert not needs_confirmation(
        compare_outcomes([rows[1]], records, without_fixes)[0], without_fixes
    )


def test_a_confirmed_verdict_is_judged_on_the_pooled_seeds():
    """An unlucky first three seeds (1/3) of a scenario passed 7 times in 9 is no regression;
    a real one fails the pooled seeds as well."""
    records = {"a": {"first_failed_by": "0", "first_fixed_by": "1"}}
    unlucky = seeds(m(collision=True), m(), m(collision=True), *[m()] * 6)
    regressed = seeds(m(collision=True), m(), m(collision=True), *[m(collision=True)] * 4, m(), m())
    clean = seeds(*[m()] * 9)
    budgets = {"at_fault_rate": 0.3, "slice_at_fault_rate": 0.3}
    first_three = evaluate_gate([row("a", unlucky[:3], clean[:3])], records, gates(budgets=budgets))
    assert not first_three.passed
    pooled = evaluate_gate([row("a", unlucky, clean)], records, gates(budgets=budgets))
    assert pooled.passed, pooled.failures
    assert pooled.comparisons[0].candidate_verdict.describe() == "7/9 seeds pass"
    refused = evaluate_gate([row("a", regressed, clean)], records, gates(budgets=budgets))
    assert any(f.startswith("new failure a") for f in refused.failures)
    # Scenarios run different seed counts once confirmed: the configured count is the least.
    mixed = evaluate_gate(
        [row("a", unlucky, clean), row("b", clean[:3], clean[:3])],
        records,
        gates(budgets=budgets),
    )
    assert mixed.aggregate["seeds_per_scenario"] == 3
    assert mixed.aggregate["confirmed_scenarios"] == 1


def test_a_fix_the_oracle_cannot_hold_does_not_bind():
    """An earlier version "fixed" a scenario the ground-truth planner fails on the same seeds:
    a lucky draw, not a fix; it is reported, not gated. The pass-rate drop still applies."""
    records = {"a": {"first_failed_by": "0", "first_fixed_by": "1"}}
    failing = seeds(m(collision=True), m(), m(collision=True))  # 1/3
    passing = seeds(m(), m(), m())
    section = gates(fixes_bind_only_where_the_oracle_passes=True)
    beyond_the_planner = [row("a", failing, copy.deepcopy(failing), oracle=failing)]
    result = evaluate_gate(beyond_the_planner, records, section)
    assert result.passed, result.failures
    assert result.comparisons[0].status == "regressed_fix"  # still reported as such
    # The oracle passes it: the fix is real and binds.
    held = [row("a", failing, copy.deepcopy(failing), oracle=passing)]
    assert evaluate_gate(held, records, section).failures[0].startswith("regressed fix a")
    # Switched off, every fix binds, as before.
    strict = gates(fixes_bind_only_where_the_oracle_passes=False)
    assert not evaluate_gate(beyond_the_planner, records, strict).passed
    # First release too.
    first = {**section, "first_release": {"max_at_fault_rate": 1.0}}
    assert evaluate_gate(beyond_the_planner, records, first, first_release=True).passed
    # A candidate far below production still fails on the pass-rate drop.
    zero = seeds(m(collision=True), m(collision=True), m(collision=True))
    dropped = [row("a", zero, passing, oracle=failing)]
    drop_gates = gates(
        fixes_bind_only_where_the_oracle_passes=True,
        budgets={"at_fault_rate": 1.0, "slice_at_fault_rate": 1.0},
    )
    refused = evaluate_gate(dropped, records, drop_gates)
    assert any(f.startswith("new failure a") for f in refused.failures), refused.failures
    almost = [row("a", zero, copy.deepcopy(failing), oracle=failing)]  # 0/3 vs 1/3: no drop
    tight = gates(
        fixes_bind_only_where_the_oracle_passes=True,
        pass_rate={"min_pass_rate": 0.66, "max_drop": 0.2},
        budgets={"at_fault_rate": 1.0, "slice_at_fault_rate": 1.0},
    )
    assert any(
        f.startswith("pass rate drop a") for f in evaluate_gate(almost, records, tight).failures
    )


def test_first_release_limit_follows_the_oracle_where_the_oracle_exceeds_it():
    """Where ground-truth perception collides more often than the absolute limit, the library is
    harder than the limit for this planner: the candidate may add at most the margin to the
    oracle's rate, on the same scenarios and seeds."""
    limits = {"max_at_fault_rate": 0.10, "max_at_fault_rate_over_oracle": 0.05}
    section = {**GATES, "first_release": limits}
    crash, clean = m(collision=True, at_fault=True), m()

    def library(candidate_crashes: int, oracle_crashes: int, n: int = 20) -> list[dict]:
        return [
            row(
                f"s{i:02d}",
                [crash if i < candidate_crashes else clean],
                [clean],
                oracle=[crash if i < oracle_crashes else clean],
            )
            for i in range(n)
        ]

    # oracle 0.15 > 0.10: limit 0.20; the candidate at 0.15 passes, at 0.25 is refused
    passed = evaluate_gate(library(3, 3), {}, section, first_release=True)
    assert passed.passed, passed.failures
    assert passed.aggregate["at_fault_rate_budget"] == pytest.approx(0.20)
    assert "oracle" in passed.aggregate["at_fault_rate_limit_from"]
    refused = evaluate_gate(library(5, 3), {}, section, first_release=True)
    assert not refused.passed
    assert any("exceeds the limit 0.200 (the oracle's rate 0.150" in f for f in refused.failures)
    # oracle 0.05, under the absolute limit: the absolute limit holds (no credit below it)
    absolute = evaluate_gate(library(3, 1), {}, section, first_release=True)
    assert not absolute.passed
    assert absolute.aggregate["at_fault_rate_budget"] == pytest.approx(0.10)
    assert any("exceeds the limit 0.100 (absolute limit" in f for f in absolute.failures)
    # without the oracle driven (an old report) or without the margin: the absolute limit
    no_oracle = [{k: v for k, v in r.items() if k != "oracle"} for r in library(3, 3)]
    assert not evaluate_gate(no_oracle, {}, section, first_release=True).passed
    no_margin = {**GATES, "first_release": {"max_at_fault_rate": 0.10}}
    assert not evaluate_gate(library(3, 3), {}, no_margin, first_release=True).passed


# -- regressions beyond chance (gates.yaml regression_significance) -------------------------
def test_worse_by_chance_p_is_fishers_exact_one_sided_test():
    # All nine candidate episodes fail, none of production's: 1 / C(18, 9).
    assert worse_by_chance_p(9, 9, 0, 9) == pytest.approx(1 / 48620)
    # The demo's cycle-2 refusal: candidate 5 of 9 failed, production 3 of 9.
    # 8 failures pooled; P(the candidate drew 5 or more of them) = 15490 / 48620.
    assert worse_by_chance_p(5, 9, 3, 9) == pytest.approx(15490 / 48620)
    assert worse_by_chance_p(0, 9, 9, 9) == 1.0  # the candidate is better
    assert worse_by_chance_p(0, 9, 0, 9) == 1.0  # nothing failed
    assert worse_by_chance_p(3, 3, 0, 3) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="candidate: 4 failures of 3"):
        worse_by_chance_p(4, 3, 0, 3)


SIGNIFICANCE = {"scenario": 0.01, "rate": 0.05}


def test_a_new_failure_within_chance_does_not_refuse_and_is_reported():
    """The demo's cycle 2: production passes 6 of 9 seeds, the candidate 4 of 9."""
    production = seeds(*[m()] * 6, *[m(collision=True, at_fault=True)] * 3)
    candidate = seeds(*[m()] * 4, *[m(collision=True, at_fault=True)] * 5)
    rows = [row("a", candidate, production)] + [row(f"b{i}", m(), m()) for i in range(30)]
    lenient = {"at_fault_rate": 0.02, "slice_at_fault_rate": 1.0}
    by_thresholds = evaluate_gate(rows, {}, gates(budgets=lenient))
    assert "new failure a" in [f.split(":")[0] for f in by_thresholds.failures]
    result = evaluate_gate(rows, {}, gates(budgets=lenient, regression_significance=SIGNIFICANCE))
    assert result.passed, result.failures
    assert result.comparisons[0].status == STATUS_NEW_FAILURE  # still reported as such
    assert result.aggregate["within_chance"] == ["a"]
    assert result.aggregate["at_fault_rate_increase_p"] > 0.05


def test_a_regression_beyond_chance_is_refused_with_its_p_value():
    production = seeds(*[m()] * 9)
    candidate = seeds(*[m()] * 2, *[m(collision=True, at_fault=True)] * 7)
    rows = [row("a", candidate, production)] + [row(f"b{i}", m(), m()) for i in range(30)]
    result = evaluate_gate(rows, {}, gates(regression_significance=SIGNIFICANCE))
    assert not result.passed
    assert result.failures[0].startswith(
        "new failure a: production passes (9/9 seeds pass), candidate 2/9 seeds pass "
        "(p = 0.001 that equal engines differ so)"
    )
    assert result.aggregate["within_chance"] == []
    # 7 at-fault episodes of 39 vs none: beyond chance library-wide too.
    assert any(f.startswith("at-fault collision rate") for f in result.failures)


def test_a_slice_over_budget_within_chance_passes_and_beyond_it_is_refused():
    """The demo's cycle 2: night/fog/highway at fault 4 of 18 episodes against 1 of 18."""

    def slice_rows(candidate_collisions: int) -> list[dict]:
        rows = []
        for i in range(6):
            crash = i < candidate_collisions
            rows.append(
                row(
                    f"n{i}",
                    seeds(m(collision=crash, at_fault=True), m(), m()),
                    seeds(m(collision=i == 0, at_fault=True), m(), m()),
                    slice_="night/fog/highway",
                )
            )
        return rows

    section = gates(
        budgets={"at_fault_rate": 1.0, "slice_at_fault_rate": 0.15},
        pass_rate={"min_pass_rate": 0.3, "max_drop": 1.0},
        regression_significance=SIGNIFICANCE,
    )
    noise = evaluate_gate(slice_rows(4), {}, section)  # 4/18 vs 1/18: p = 0.17
    assert noise.passed, noise.failures
    (night,) = noise.slices
    assert night["candidate_at_fault"] == 4 and night["production_at_fault"] == 1
    assert night["gated"] and night["passed"]
    worse = evaluate_gate(slice_rows(6), {}, {**section, "regression_significance": {"rate": 0.1}})
    assert worse.failures == [
        "slice night/fog/highway: at-fault collision rate 0.333 exceeds production's 0.056 by "
        "0.278 > budget 0.150 (p = 0.044 that equal engines differ so)"
    ]


def test_confirmation_does_not_wait_for_significance():
    """Three seeds cannot show significance; the confirmation seeds are what may."""
    comparison = compare_outcomes(
        [row("a", seeds(m(collision=True), m(collision=True), m()), seeds(m(), m(), m()))],
        {},
        gates(regression_significance=SIGNIFICANCE),
    )[0]
    assert needs_confirmation(comparison, gates(regression_significance=SIGNIFICANCE))


def test_an_engine_against_itself_on_independent_seeds_is_certified():
    """The A/A run that tests noise: the same odds, each engine on its own seeds, the shard's
    confirmation procedure and the repository's gates. By the thresholds alone an equal
    candidate is refused most of the time; beyond-chance verdicts certify it, and still refuse
    a candidate that breaks a scenario. Seeded: the rates are exact for these draws."""
    repository = dict(gate_section())
    assert certify_rate(1, 60, repository) >= 0.85
    thresholds_only = {**repository, "regression_significance": None}
    assert certify_rate(1, 60, thresholds_only) <= 0.3
    assert certify_rate(2, 30, repository, regression=(1, 0.95)) <= 0.05
    assert certify_rate(3, 60, repository, regression=(3, 0.8)) <= 0.05
    assert certify_rate(3, 60, repository, regression=(3, 0.6)) <= 0.25


def test_a_fix_its_own_fixer_fails_on_the_same_seeds_does_not_bind():
    """Seed 11's cycle 2: v1 "fixed" a cut-in scenario; on the report's nine seeds v1 itself
    (production) passes 3, the candidate 5, the oracle 8. The candidate is better than the
    fixer: no regressed fix. Where the fixer still passes, the fix binds."""
    records = {"a": {"first_failed_by": "0", "first_fixed_by": "1"}}
    brakes = m(brakes=7)
    candidate = seeds(*[m()] * 5, *[brakes] * 4)  # 5/9
    fixer = seeds(*[m()] * 3, *[brakes] * 6)  # 3/9
    oracle = seeds(*[m()] * 8, brakes)
    section = gates(
        fixes_bind_only_where_the_oracle_passes=True, fixes_bind_only_while_the_fixer_passes=True
    )
    rows = [row("a", candidate, fixer, oracle=oracle)]
    result = evaluate_gate(rows, records, section, production_version="1")
    assert result.passed, result.failures
    assert result.comparisons[0].status == "regressed_fix"  # still reported as such
    # Production is another version than the fixer: the fix binds as before.
    other = evaluate_gate(rows, records, section, production_version="2")
    assert other.failures[0].startswith("regressed fix a: fixed by model version 1")
    assert evaluate_gate(rows, records, section).failures[0].startswith("regressed fix a")
    # The fixer still passes it on these seeds: the fix binds.
    held = [row("a", candidate, seeds(*[m()] * 9), oracle=oracle)]
    assert not evaluate_gate(held, records, section, production_version="1").passed
    # Switched off, every fix binds.
    strict = gates(fixes_bind_only_where_the_oracle_passes=True)
    assert not evaluate_gate(rows, records, strict, production_version="1").passed
    # Confirmation judges every fix (the pooled seeds decide afterwards).
    (comparison,) = compare_outcomes(rows, records, section, "1")
    assert needs_confirmation(comparison, section)
