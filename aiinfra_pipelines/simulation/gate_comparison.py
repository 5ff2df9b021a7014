"""Every engine's episodes on each scenario side by side, paired seed by seed.

The comparison is the gate's unit of account: the report, the scenario library's
first-failed / first-fixed records, the sequential evidence plan (which scenario needs more
seeds) and the gate's tests all read it, so it stands apart from the rules that judge it.

Per scenario, the candidate is *held to* references, each by a paired test of failed episodes
(:class:`PairedTest`): production (the reference release), unless this is the first release;
and the version that fixed the scenario, where the library recorded a confirmed fix by a
version other than production (its outcomes on the same seeds). Statuses (``pass``,
``new_failure``, ...) describe pass rates for people; the tests decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.statistics.paired import PairedCounts, sign_test_p

from .gate_verdicts import (
    FAILED,
    ScenarioResult,
    episodes_of,
    gate_section,
    min_pass_rate,
    paired_counts,
    scenario_criteria,
    scenario_result,
)
from .roles import (
    ROLE_CANDIDATE,
    ROLE_FIXER,
    ROLE_MODEL_ZERO,
    ROLE_ORACLE,
    ROLE_PRODUCTION,
    ROLES,
)

STATUS_PASS = "pass"
STATUS_NEW_FAILURE = "new_failure"
STATUS_REGRESSED_FIX = "regressed_fix"  # fixed by an earlier version, failing again
STATUS_FIXED = "fixed"  # production fails it, the candidate passes
STATUS_STILL_FAILING = "still_failing"


@dataclass(frozen=True)
class PairedTest:
    """The candidate against one reference on one scenario: failed episodes paired by seed,
    and the one-sided exact McNemar p-value of "the candidate fails more often"."""

    scenario_id: str
    reference: str  # the reference's role: production or fixer
    reference_version: str | None
    counts: PairedCounts

    @property
    def key(self) -> tuple[str, str]:
        return (self.scenario_id, self.reference)

    @property
    def p_value(self) -> float:
        return sign_test_p(self.counts.worse, self.counts.better)

    def describe(self) -> str:
        c = self.counts
        return (
            f"candidate failed on {c.worse} of {c.pairs} paired seeds where {self.reference} "
            f"{self.reference_version} passed, {self.reference} on {c.better} where the "
            f"candidate passed"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "reference_version": self.reference_version,
            "outcome": FAILED,
            **self.counts.to_dict(),
            "p_value": self.p_value,
        }


@dataclass(frozen=True)
class ScenarioComparison:
    """One scenario's episodes for every engine, with verdicts, status and paired tests.

    ``candidate`` / ``production`` (and ``oracle`` / ``model_zero`` / ``fixer`` where driven)
    are the per-seed episode metrics; the ``*_verdict`` fields judge them over the seeds.
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
    fixer: Sequence[Mapping[str, Any]] = ()
    fixer_verdict: ScenarioResult | None = None
    fixer_version: str | None = None
    tests: tuple[PairedTest, ...] = ()

    def result(self, role: str) -> ScenarioResult | None:
        return getattr(self, f"{role}_verdict")

    @property
    def seeds(self) -> tuple[int | None, ...]:
        return self.candidate_verdict.seeds


@dataclass
class GateResult:
    passed: bool
    failures: list[str]
    comparisons: list[ScenarioComparison]
    aggregate: dict[str, Any]
    slices: list[dict[str, Any]] = field(default_factory=list)
    tests: list[dict[str, Any]] = field(default_factory=list)


def binding_fixer(
    record: Mapping[str, Any] | None, production_version: str | None
) -> tuple[str, str] | None:
    """(version, engine sha256) of a recorded fix the candidate is held to, or ``None``.

    A fix binds when the library recorded it as confirmed (with the fixer's engine, whose
    outcomes on the same seeds the candidate is paired with) and the fixer is not production
    itself (then the comparison with production already holds the candidate to it). Records
    from before fixes were confirmed carry no engine: they are reported, not binding.
    """
    record = record or {}
    version, engine = record.get("first_fixed_by"), record.get("fixed_engine_sha256")
    if not version or not engine or str(version) == str(production_version):
        return None
    return str(version), str(engine)


def _status(candidate: ScenarioResult, production: ScenarioResult, fixed_by: str | None) -> str:
    if candidate.passed:
        return STATUS_PASS if production.passed else STATUS_FIXED
    if production.passed:
        return STATUS_NEW_FAILURE
    return STATUS_REGRESSED_FIX if fixed_by else STATUS_STILL_FAILING


def compare_outcomes(
    outcomes: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any] | None = None,
    production_version: str | None = None,
    *,
    first_release: bool = False,
) -> list[ScenarioComparison]:
    """Verdicts and paired tests for every outcome row (``scenario_id``, ``slice``, ``kind``,
    ``road_type``, and per role — ``candidate``, ``production``, optionally ``oracle``,
    ``model_zero`` and ``fixer`` (with ``fixer_version``) — the episodes, each with its
    ``seed``); ``records`` are the library's fix records by scenario id.

    Before the first release (``first_release``) production is model zero, which no car runs:
    the candidate is not held to it, only to recorded fixes (and, library-wide, to the oracle).
    """
    section = gate_section(gates)
    threshold = min_pass_rate(section)
    comparisons = []
    for row in sorted(outcomes, key=lambda r: r["scenario_id"]):
        criteria = scenario_criteria(row["scenario_id"], section)
        episodes = {role: episodes_of(row.get(role)) for role in (*ROLES, ROLE_FIXER)}
        results = {
            role: scenario_result(runs, row["road_type"], criteria, threshold) if runs else None
            for role, runs in episodes.items()
        }
        if results[ROLE_CANDIDATE] is None or results[ROLE_PRODUCTION] is None:
            raise ValueError(f"scenario {row['scenario_id']}: candidate and production needed")
        comparisons.append(
            _assemble(
                ScenarioKey(row["scenario_id"], row["slice"], row["kind"], row["road_type"]),
                episodes,
                results,
                first_fixed_by=(records.get(row["scenario_id"]) or {}).get("first_fixed_by"),
                fixer_version=str(row["fixer_version"]) if results[ROLE_FIXER] else None,
                production_version=production_version,
                first_release=first_release,
            )
        )
    return comparisons


def first_seeds(
    comparisons: Sequence[ScenarioComparison], count: int, *, first_release: bool
) -> list[ScenarioComparison]:
    """The comparisons on each scenario's first ``count`` seeds only (the sample every engine
    drove on every scenario), judged from the verdicts already made."""
    restricted = []
    for c in comparisons:
        keep = set(c.seeds[:count])
        episodes = {
            role: [e for e in getattr(c, role) if e.get("seed") in keep]
            for role in (*ROLES, ROLE_FIXER)
        }
        results = {
            role: None if (result := c.result(role)) is None else result.restricted(keep)
            for role in (*ROLES, ROLE_FIXER)
        }
        restricted.append(
            _assemble(
                ScenarioKey(c.scenario_id, c.slice, c.kind, c.road_type),
                episodes,
                results,
                first_fixed_by=c.first_fixed_by,
                fixer_version=c.fixer_version,
                production_version=c.production_version,
                first_release=first_release,
            )
        )
    return restricted


@dataclass(frozen=True)
class ScenarioKey:
    scenario_id: str
    slice: str
    kind: str
    road_type: str


def _assemble(
    key: ScenarioKey,
    episodes: Mapping[str, Sequence[Mapping[str, Any]]],
    results: Mapping[str, ScenarioResult | None],
    *,
    first_fixed_by: str | None,
    fixer_version: str | None,
    production_version: str | None,
    first_release: bool,
) -> ScenarioComparison:
    """A comparison from judged episodes: status and the paired tests that bind it."""
    candidate, production = results[ROLE_CANDIDATE], results[ROLE_PRODUCTION]
    assert candidate is not None and production is not None
    fixer = results[ROLE_FIXER]
    tests = []
    if not first_release:
        tests.append(
            PairedTest(
                key.scenario_id,
                ROLE_PRODUCTION,
                production_version,
                paired_counts(candidate, production, FAILED),
            )
        )
    if fixer is not None:
        tests.append(
            PairedTest(
                key.scenario_id, ROLE_FIXER, fixer_version, paired_counts(candidate, fixer, FAILED)
            )
        )
    return ScenarioComparison(
        scenario_id=key.scenario_id,
        slice=key.slice,
        kind=key.kind,
        road_type=key.road_type,
        candidate=episodes[ROLE_CANDIDATE],
        production=episodes[ROLE_PRODUCTION],
        candidate_verdict=candidate,
        production_verdict=production,
        first_fixed_by=first_fixed_by,
        status=_status(candidate, production, first_fixed_by),
        oracle=episodes[ROLE_ORACLE],
        model_zero=episodes[ROLE_MODEL_ZERO],
        oracle_verdict=results[ROLE_ORACLE],
        model_zero_verdict=results[ROLE_MODEL_ZERO],
        production_version=production_version,
        fixer=episodes[ROLE_FIXER],
        fixer_verdict=fixer,
        fixer_version=fixer_version,
        tests=tuple(tests),
    )
