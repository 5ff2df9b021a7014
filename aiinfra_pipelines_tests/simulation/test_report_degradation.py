"""Regression reports count the degradation state machine's transitions per scenario."""

from __future__ import annotations

from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.regression import comparison_rows
from aiinfra_pipelines.simulation.report_view import report_table_rows

from .test_gate import m, row, seeds
from .test_library import GATES


def transition(step: int, from_state: str, to_state: str, cause: str) -> dict:
    return {
        "step": step,
        "timestamp_ns": step * 200_000_000,
        "from_state": from_state,
        "to_state": to_state,
        "cause": cause,
        "detail": "measured",
    }


def test_transitions_are_counted_per_scenario_by_cause_and_kept_per_episode():
    faulty = {
        **m(),
        "degradation_transitions": [
            transition(2, "nominal", "degraded", "engine_error"),
            transition(17, "degraded", "minimal_risk", "degraded_timeout"),
            transition(36, "minimal_risk", "nominal", "recovered"),
        ],
        "degraded_steps": 15,
        "minimal_risk_steps": 19,
        "engine_errors": 20,
    }
    dim = {
        **m(),
        "degradation_transitions": [
            transition(4, "nominal", "degraded", "low_confidence"),
            transition(9, "degraded", "nominal", "recovered"),
        ],
    }
    # Production's outcomes come from a cache older than the state machine: no such keys.
    rows = [row("a", seeds(faulty, dim), seeds(m(), m()))]
    result = evaluate_gate(rows, {}, GATES)
    (entry,) = comparison_rows(result.comparisons, result.tests)
    candidate, production = entry["candidate"], entry["production"]
    assert candidate["degradation_transition_count"] == 5
    assert candidate["degradation_causes"] == {
        "degraded_timeout": 1,
        "engine_error": 1,
        "low_confidence": 1,
        "recovered": 2,
    }
    assert candidate["minimal_risk_episodes"] == 1
    first = candidate["episodes"][0]
    assert [t["cause"] for t in first["degradation_transitions"]] == [
        "engine_error",
        "degraded_timeout",
        "recovered",
    ]
    assert (first["degraded_steps"], first["minimal_risk_steps"], first["engine_errors"]) == (
        15,
        19,
        20,
    )
    assert production["degradation_transition_count"] == 0
    assert production["degradation_causes"] == {} and production["minimal_risk_episodes"] == 0
    assert production["episodes"][0]["degradation_transitions"] == []
    # Existing keys are untouched; the table gains the candidate's count.
    assert {"fallback_activations", "pass_rate", "episodes"} <= set(candidate)
    (table,) = report_table_rows({"scenarios": [entry]})
    assert table["cand. degradations"] == 5 and "cand. fallbacks" in table
