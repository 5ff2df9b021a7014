"""The regression gate on hand-built outcomes: what passes a scenario, and when a candidate is
refused (new failures, regressed fixes, collision budgets in total and per slice)."""

from __future__ import annotations

import copy

import pytest

from aiinfra_pipelines.simulation.gate import (
    STATUS_FIXED,
    STATUS_NEW_FAILURE,
    STATUS_PASS,
    STATUS_STILL_FAILING,
    evaluate_gate,
    gate_section,
    scenario_criteria,
    scenario_verdict,
)

from .test_library import GATES


def m(collision=False, ttc=None, brakes=0, progress=80.0, duration=4.0):
    return {
        "collision": collision,
        "collision_step": 2 if collision else None,
        "min_ttc_s": ttc,
        "hard_brakes": brakes,
        "progress_m": progress,
        "duration_s": duration,
    }


def row(scenario_id, candidate, production, slice_="day/clear/highway", road="highway"):
    return {
        "scenario_id": scenario_id,
        "slice": slice_,
        "kind": "base",
        "road_type": road,
        "candidate": candidate,
        "production": production,
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
        "collision at step 2",
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


def test_the_repository_gates_are_complete():
    section = gate_section()
    for road in ("highway", "merge", "roundabout", "intersection"):
        assert road in section["scenario_pass"]["min_progress_mps"]
    assert section["no_new_failures"] is True


def test_candidate_failing_what_production_passes_is_refused():
    result = evaluate_gate([row("a", m(collision=True), m()), row("b", m(), m())], {}, GATES)
    assert not result.passed
    statuses = {c.scenario_id: c.status for c in result.comparisons}
    assert statuses == {"a": STATUS_NEW_FAILURE, "b": STATUS_PASS}
    assert result.failures[0] == "new failure a: production passes, candidate: collision at step 2"
    assert result.aggregate["candidate_collision_rate"] == 0.5


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


def test_failing_where_production_also_fails_is_tolerated_unless_it_collides_more():
    tolerated = evaluate_gate([row("a", m(progress=10.0), m(progress=12.0))], {}, GATES)
    assert tolerated.passed
    assert tolerated.comparisons[0].status == STATUS_STILL_FAILING
    worse = evaluate_gate([row("a", m(collision=True), m(progress=12.0))], {}, GATES)
    assert not worse.passed
    assert any(
        f.startswith("collision rate 1.000 exceeds production's 0.000") for f in worse.failures
    )


def test_slice_budget_catches_what_the_total_hides():
    rows = [
        row("n1", m(collision=True), m(progress=1.0), slice_="night/fog/highway"),
        row("d1", m(), m(), slice_="day/clear/highway"),
        row("d2", m(), m(), slice_="day/clear/highway"),
        row("d3", m(), m(), slice_="day/clear/highway"),
    ]
    section = gates(budgets={"collision_rate": 0.5, "slice_collision_rate": 0.0})
    result = evaluate_gate(rows, {}, section)
    assert not result.passed
    assert result.failures == [
        "slice night/fog/highway: collision rate 1.000 exceeds production's 0.000 by 1.000 > "
        "budget 0.000"
    ]
    # Slices with fewer scenarios than min_slice_scenarios are reported, not gated.
    lenient = evaluate_gate(rows, {}, {**section, "min_slice_scenarios": 2})
    assert lenient.passed
    night = next(s for s in lenient.slices if s["slice"] == "night/fog/highway")
    assert night["gated"] is False and night["candidate_collisions"] == 1


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
    section = {**GATES, "first_release": {"max_collision_rate": 0.5}}
    rows = [row("a", m(collision=True), m()), row("b", m(), m()), row("c", m(), m())]
    compared = evaluate_gate(rows, {}, section)
    assert not compared.passed and any(f.startswith("new failure a") for f in compared.failures)

    first = evaluate_gate(rows, {}, section, first_release=True)
    assert first.passed, first.failures
    assert first.aggregate["first_release"] is True
    assert first.aggregate["candidate_collision_rate"] == round(1 / 3, 6)

    strict = {**GATES, "first_release": {"max_collision_rate": 0.2}}
    refused = evaluate_gate(rows, {}, strict, first_release=True)
    assert not refused.passed
    assert any("exceeds the absolute limit 0.200" in f for f in refused.failures)


def test_first_release_still_keeps_fixed_scenarios_fixed_and_needs_its_limits():
    rows = [row("a", m(collision=True), m(collision=True))]
    records = {"a": {"first_fixed_by": "3"}}
    section = {**GATES, "first_release": {"max_collision_rate": 1.0}}
    result = evaluate_gate(rows, records, section, first_release=True)
    assert any(f.startswith("regressed fix a") for f in result.failures)
    without = {key: value for key, value in GATES.items() if key != "first_release"}
    with pytest.raises(ValueError, match="first_release is missing"):
        evaluate_gate(rows, {}, without, first_release=True)
