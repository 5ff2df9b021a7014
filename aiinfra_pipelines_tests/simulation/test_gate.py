"""The regression gate on hand-built outcomes: what fails an episode, the paired per-scenario
tests (Holm over the library), the library-wide and per-slice at-fault tests on the first stage
of seeds, fixes held paired to their fixer, and the first release judged against the oracle.
Every refusal names its rule and scenario or slice."""

from __future__ import annotations

import copy

import pytest

from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.gate_comparison import (
    STATUS_FIXED,
    STATUS_NEW_FAILURE,
    STATUS_PASS,
    STATUS_STILL_FAILING,
    binding_fixer,
    compare_outcomes,
)
from aiinfra_pipelines.simulation.gate_evidence import next_request
from aiinfra_pipelines.simulation.gate_settings import (
    EvidencePlan,
    GateSettingsError,
    SimulationGate,
)
from aiinfra_pipelines.simulation.gate_verdicts import (
    gate_section,
    scenario_criteria,
    scenario_verdict,
)

GATES = gate_section()  # the repository's gates.yaml simulation section


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


CRASH = m(collision=True, at_fault=True)
SLOW = m(progress=1.0)


def seeds(*episodes):
    """Per-seed episodes of one engine on one scenario (seeds numbered from 0)."""
    return [{**e, "seed": i} for i, e in enumerate(episodes)]


def clean(n):
    return seeds(*[m()] * n)


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
    for path, value in changes.items():
        node = section
        *parents, last = path.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return section


def library(n=30, seeds_each=12):
    """A clean library of ``n`` scenarios both engines pass on every seed."""
    return [row(f"z{i:02d}", clean(seeds_each), clean(seeds_each)) for i in range(n)]


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
    section = gates(scenario_overrides={"slow_*": {"min_progress_mps": 5.0}})
    assert scenario_criteria("slow_lead-1", section)["min_progress_mps"] == 5.0
    assert scenario_verdict(
        m(progress=40.0), "highway", scenario_criteria("slow_x", section)
    ).passed


def test_a_collision_ego_did_not_cause_is_no_failure():
    criteria = GATES["scenario_pass"]
    rear_ended = m(collision=True, at_fault=False)
    assert scenario_verdict(rear_ended, "highway", criteria).passed
    strict = {**criteria, "no_collision": True}
    assert not scenario_verdict(rear_ended, "highway", strict).passed


def test_the_repository_gates_are_complete_and_state_their_error_rates():
    settings = SimulationGate.from_section(GATES)
    assert settings.evidence.first_stage >= 10
    levels = settings.levels
    # The family-wise levels of the tests an equal candidate faces add up to at most 5 %.
    assert levels.scenario_alpha + levels.library_alpha + levels.slice_alpha <= 0.05 + 1e-12
    assert GATES["false_refusal"]["aa_certified"] >= 0.95
    assert GATES["tests"]["scenario"]["must_catch"]["scenario_regression_refused"] >= 0.95
    assert GATES["first_release"]["must_catch"]["first_release_bad_refused"] >= 0.90
    for removed in ("fixes_bind_only_while_the_fixer_passes", "regression_significance"):
        assert removed not in GATES


def test_impossible_settings_are_refused_naming_the_key():
    with pytest.raises(GateSettingsError, match="seed_stages must increase"):
        EvidencePlan(seed_stages=(10, 10), continue_z=(1.0,))
    with pytest.raises(GateSettingsError, match="one threshold per step"):
        EvidencePlan(seed_stages=(10, 20, 30), continue_z=(1.0,))
    with pytest.raises(GateSettingsError, match=r"simulation.tests.scenario.alpha = 2.0"):
        SimulationGate.from_section(gates(tests__scenario__alpha=2.0))
    broken = gates()
    del broken["first_release"]["alpha"]
    with pytest.raises(GateSettingsError, match=r"simulation\.first_release\.alpha is not set"):
        SimulationGate.from_section(broken)


def test_a_scenario_the_candidate_fails_where_production_passes_is_refused_by_its_pairs():
    candidate = seeds(*[CRASH] * 11, m())
    rows = [row("a", candidate, clean(12)), *library()]
    result = evaluate_gate(rows, {}, GATES, production_version="4")
    assert not result.passed
    (failure,) = [f for f in result.failures if f.startswith("scenario a:")]
    assert failure.startswith(
        "scenario a: worse than production: candidate failed on 11 of 12 paired seeds where "
        "production 4 passed, production on 0 where the candidate passed (exact McNemar "
        "p = 0.00049 <= Holm level 0.00065)"
    )
    (test,) = [t for t in result.tests if t["scenario_id"] == "a"]
    assert (test["worse"], test["better"], test["pairs"], test["regressed"]) == (11, 0, 12, True)
    assert test["holm_level"] == pytest.approx(0.02 / 31)
    assert result.comparisons[0].status == STATUS_NEW_FAILURE


def test_a_worse_pass_rate_within_chance_is_not_refused_and_the_report_says_why():
    """The demo's cycle 2: production passes 6 of 9 seeds, the candidate 4 of 9."""
    production = seeds(*[m()] * 6, *[SLOW] * 3)
    candidate = seeds(*[m()] * 4, *[SLOW] * 5)
    result = evaluate_gate([row("a", candidate, production), *library()], {}, GATES)
    assert result.passed, result.failures
    (test,) = [t for t in result.tests if t["scenario_id"] == "a"]
    assert (test["worse"], test["better"]) == (2, 0)
    assert test["p_value"] == pytest.approx(0.25) and test["regressed"] is False
    assert result.comparisons[0].status == STATUS_NEW_FAILURE  # described, not decided


def test_pairing_counts_only_the_seeds_where_the_engines_differ():
    """Both fail the same hard seeds: five failures each is no evidence at all (Fisher on the
    totals would have seen 5 vs 5 too, but it cannot tell 5 shared from 5 disjoint)."""
    shared = seeds(*[SLOW] * 5, *[m()] * 7)
    disjoint = seeds(*[m()] * 5, *[SLOW] * 5, m(), m())
    same = evaluate_gate([row("a", shared, copy.deepcopy(shared))], {}, GATES)
    (test,) = same.tests
    assert (test["worse"], test["better"], test["p_value"]) == (0, 0, 1.0)
    other = evaluate_gate([row("a", disjoint, shared)], {}, GATES)
    (test,) = other.tests
    assert (test["worse"], test["better"]) == (5, 5)


def test_holm_holds_the_smallest_p_value_to_alpha_over_the_family():
    """Two scenarios with the same strong evidence: the first is held to alpha/m, the second to
    alpha/(m - 1); both are refused."""
    candidate = seeds(*[CRASH] * 12)
    rows = [row("a", candidate, clean(12)), row("b", candidate, clean(12)), *library(8)]
    result = evaluate_gate(rows, {}, GATES)
    levels = sorted(t["holm_level"] for t in result.tests if t["regressed"])
    assert levels == pytest.approx([0.02 / 10, 0.02 / 9])
    assert [f.split(":")[0] for f in result.failures[:2]] == ["scenario a", "scenario b"]


def test_improvements_pass_and_are_described():
    rows = [row("a", clean(12), seeds(*[SLOW] * 12)), row("b", clean(12), clean(12))]
    result = evaluate_gate(rows, {}, GATES)
    assert result.passed, result.failures
    assert {c.scenario_id: c.status for c in result.comparisons} == {
        "a": STATUS_FIXED,
        "b": STATUS_PASS,
    }


def test_failing_where_production_fails_alike_is_tolerated():
    result = evaluate_gate([row("a", seeds(*[SLOW] * 12), seeds(*[SLOW] * 12))], {}, GATES)
    assert result.passed and result.comparisons[0].status == STATUS_STILL_FAILING


def test_the_library_at_fault_test_reads_the_first_stage_of_seeds_only():
    """One at-fault episode more per scenario on 24 scenarios: refused library-wide; the same
    excess only on seeds past the first stage (a scenario run longer) does not count there."""
    first = SimulationGate.from_section(GATES).evidence.first_stage
    worse = seeds(CRASH, *[m()] * (first - 1))
    rows = [row(f"s{i:02d}", worse, clean(first)) for i in range(24)]
    result = evaluate_gate(rows, {}, GATES)
    assert any(
        f.startswith("library: at-fault collision rate worse than production")
        for f in result.failures
    )
    assert result.aggregate["at_fault_worse"] == 24 and result.aggregate["at_fault_better"] == 0
    assert result.aggregate["at_fault_p"] == pytest.approx(0.5**24)
    low, high = result.aggregate["at_fault_difference_bounds"]
    assert low > 0 and high < 1
    late = seeds(*[m()] * first, CRASH, m())
    rows = [row(f"s{i:02d}", late, clean(first + 2)) for i in range(24)]
    result = evaluate_gate(rows, {}, GATES)
    assert result.aggregate["at_fault_pairs"] == 24 * first
    assert result.aggregate["at_fault_worse"] == 0
    assert not any(f.startswith("library") for f in result.failures)


def test_collisions_production_did_not_cause_do_not_count_against_it_either():
    rear_ended = m(collision=True, at_fault=False)
    result = evaluate_gate([row("a", seeds(CRASH), seeds(rear_ended))], {}, GATES)
    assert result.aggregate["candidate_collisions"] == result.aggregate["production_collisions"]
    assert result.aggregate["production_at_fault"] == 0 and result.aggregate["at_fault_worse"] == 1


def test_a_slice_is_tested_when_it_has_enough_scenarios_bonferroni_over_slices():
    night = [
        row(f"n{i}", seeds(*[CRASH] * 3, *[m()] * 9), clean(12), slice_="night/fog/highway")
        for i in range(3)
    ]
    day = [row(f"d{i}", clean(12), clean(12)) for i in range(3)]
    result = evaluate_gate([*night, *day], {}, gates(tests__scenario__alpha=1e-9))
    failures = [f for f in result.failures if f.startswith("slice")]
    assert failures == [
        "slice night/fog/highway: at-fault collision rate worse than production's: 9 of 36 "
        "paired episodes against 0 (exact McNemar p = 0.002 <= 0.005, 2 gated slices)"
    ]
    small = evaluate_gate(night[:2] + day, {}, gates(tests__scenario__alpha=1e-9))
    fog = next(s for s in small.slices if s["slice"] == "night/fog/highway")
    assert fog["gated"] is False and fog["candidate_at_fault"] == 6


def test_the_same_outcomes_for_candidate_and_production_always_pass():
    episodes = [
        seeds(m(), CRASH, m()),
        seeds(SLOW, SLOW, CRASH),
        seeds(m(collision=True, at_fault=False), m(), m(brakes=9)),
    ]
    rows = [
        row(f"s{i}", e, copy.deepcopy(e), slice_=f"day/clear/{i}") for i, e in enumerate(episodes)
    ]
    result = evaluate_gate(rows, {}, GATES)
    assert result.passed, result.failures
    assert result.aggregate["at_fault_difference"] == 0.0
    assert all(t["worse"] == t["better"] == 0 for t in result.tests)


def test_oracle_and_model_zero_are_reported_not_gated():
    rows = [
        row("a", seeds(m()), seeds(m()), oracle=seeds(m()), model_zero=seeds(CRASH)),
        row(
            "b",
            seeds(m()),
            seeds(m()),
            oracle=seeds(m(collision=True, at_fault=False)),
            model_zero=seeds(SLOW),
        ),
    ]
    result = evaluate_gate(rows, {}, GATES)
    assert result.passed
    aggregate = result.aggregate
    assert aggregate["oracle_at_fault"] == 0 and aggregate["oracle_collisions"] == 1
    assert aggregate["model_zero_at_fault"] == 1 and aggregate["model_zero_passed"] == 0
    plain = evaluate_gate([row("a", seeds(m()), seeds(m()))], {}, GATES)
    assert plain.aggregate["oracle_at_fault"] is None  # absent, not zero


def test_nothing_simulated_proves_nothing():
    result = evaluate_gate([], {}, GATES)
    assert not result.passed and "no scenarios were simulated" in result.failures[0]


# -- fixes ----------------------------------------------------------------------------------
def test_a_confirmed_fix_by_another_version_binds_the_candidate_to_the_fixers_seeds():
    """Version 2 fixed ``a`` (production 1 fails it); version 2 was not released. A candidate
    failing ``a`` again on the seeds version 2 passed is refused for it, paired; one failing
    where version 2 failed too is not."""
    record = {"a": {"first_failed_by": "1", "first_fixed_by": "2", "fixed_engine_sha256": "f"}}
    assert binding_fixer(record["a"], "1") == ("2", "f")
    assert binding_fixer(record["a"], "2") is None  # the fixer is production: one test
    assert binding_fixer({"first_fixed_by": "2"}, "1") is None  # a record from before gates-2
    failing = seeds(*[SLOW] * 12)
    regressed = row("a", failing, failing, fixer=clean(12), fixer_version="2")
    result = evaluate_gate([regressed, *library(5)], record, GATES, production_version="1")
    (failure,) = [f for f in result.failures if f.startswith("scenario a")]
    assert failure.startswith(
        "scenario a: regressed fix of model version 2: candidate failed on 12 of 12 paired seeds "
        "where fixer 2 passed"
    )
    held = seeds(*[SLOW] * 3, *[m()] * 9)
    fixer = seeds(*[SLOW] * 3, *[m()] * 9)
    fine = row("a", held, failing, fixer=fixer, fixer_version="2")
    assert evaluate_gate([fine, *library(5)], record, GATES, production_version="1").passed


def test_the_first_release_is_held_to_the_oracle_not_to_model_zero():
    """Model zero passes by never driving fast; before any release the gate ignores it. The
    candidate must be shown within the margin of the oracle's at-fault rate, paired."""
    n = 40
    equal = [row(f"s{i:02d}", clean(12), seeds(*[SLOW] * 12), oracle=clean(12)) for i in range(n)]
    first = evaluate_gate(equal, {}, GATES, first_release=True)
    assert first.passed, first.failures
    assert first.aggregate["first_release"] is True
    assert (
        first.aggregate["first_release_upper_bound"]
        < GATES["first_release"]["max_at_fault_increase"]
    )
    assert first.tests == []  # production (model zero) binds no scenario
    worse = [
        row(f"s{i:02d}", seeds(CRASH, *[m()] * 11), seeds(*[SLOW] * 12), oracle=clean(12))
        for i in range(n)
    ]
    refused = evaluate_gate(worse, {}, GATES, first_release=True)
    (failure,) = refused.failures
    assert failure.startswith(
        "first release: at-fault collision rate not shown within +0.040 of the oracle's: "
        "difference +0.083 over 480 paired episodes (40 at fault where the oracle was not, 0 "
        "the reverse), upper 95% bound +"
    )


def test_too_little_evidence_does_not_certify_a_first_release():
    tiny = [row("a", seeds(m()), seeds(SLOW), oracle=seeds(m()))]
    result = evaluate_gate(tiny, {}, GATES, first_release=True)
    assert not result.passed
    assert result.failures[0].startswith("first release: at-fault collision rate not shown")


def test_first_release_counts_only_collisions_the_candidate_caused():
    rear_ended = m(collision=True, at_fault=False)
    rows = [
        row(f"s{i:02d}", seeds(*[rear_ended] * 12), clean(12), oracle=clean(12)) for i in range(40)
    ]
    assert evaluate_gate(rows, {}, GATES, first_release=True).passed


# -- the evidence plan ------------------------------------------------------------------------
def test_a_scenario_in_doubt_runs_its_next_stage_with_the_references_in_doubt():
    plan = EvidencePlan(seed_stages=(4, 8, 16), continue_z=(1.0, 1.5))
    records = {"f": {"first_fixed_by": "2", "fixed_engine_sha256": "x"}}

    def request(candidate, production, **more):
        (comparison,) = compare_outcomes(
            [row("f", candidate, production, **more)], records, GATES, "1"
        )
        return next_request(comparison, plan)

    assert request(clean(4), clean(4)) == (0, ())  # nothing in doubt
    assert request(seeds(SLOW, m(), m(), m()), clean(4)) == (8, ("candidate", "production"))
    assert request(seeds(SLOW, SLOW, m(), m()), seeds(m(), SLOW, m(), m())) == (
        8,
        ("candidate", "production"),
    )  # 1 worse, 0 better: z = 1
    assert request(seeds(SLOW, m(), SLOW, m()), seeds(m(), SLOW, m(), m())) == (0, ())  # z = 0
    # Held to a fixer too: only the reference in doubt drives again.
    assert request(
        seeds(SLOW, m(), m(), m()), seeds(SLOW, m(), m(), m()), fixer=clean(4), fixer_version="2"
    ) == (8, ("candidate", "fixer"))
    # After stage two the bar is higher: 2 worse of 8 (z = 1.41 < 1.5) stops.
    assert request(seeds(SLOW, SLOW, *[m()] * 6), clean(8)) == (0, ())
    assert request(seeds(SLOW, SLOW, SLOW, *[m()] * 5), clean(8))[0] == 16
    # The last stage ran: nothing more, whatever the doubt.
    assert request(seeds(*[SLOW] * 16), clean(16)) == (0, ())
    # Before the first release production (model zero) is no reference.
    (first,) = compare_outcomes(
        [row("f", seeds(SLOW, m(), m(), m()), clean(4))], {}, GATES, first_release=True
    )
    assert next_request(first, plan) == (0, ())
