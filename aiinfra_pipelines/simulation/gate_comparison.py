"""Every engine's verdicts on each scenario side by side, and the status that follows.

The comparison is the gate's unit of account: the report, the scenario library's
first-failed / first-fixed records and the gate's own rules all read it, so it stands
apart from the rules that judge it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .gate_verdicts import (
    ScenarioResult,
    episodes_of,
    gate_section,
    min_pass_rate,
    scenario_criteria,
    scenario_result,
)
from .roles import ROLE_CANDIDATE, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION, ROLES

STATUS_PASS = "pass"
STATUS_NEW_FAILURE = "new_failure"
STATUS_REGRESSED_FIX = "regressed_fix"  # fixed by an earlier version, failing again
STATUS_FIXED = "fixed"  # production fails it, the candidate passes
STATUS_STILL_FAILING = "still_failing"


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
