"""The closed-loop regression gate: may the candidate replace the reference release?

Pure functions over per-episode metrics; every number from ``gates.yaml`` ``simulation:``.

* An *episode* passes when ego caused no collision (at fault, as nuPlan counts it:
  :mod:`.collisions`; being rear-ended while stopped is no failure), the minimum
  time-to-collision stayed above its floor, hard brakes stayed within their count and the car
  made progress (per road type, with fnmatch overrides per scenario id).
* Every engine drives the *same* seeds of a scenario (a pure function of the scenario's
  content: :func:`.scenarios.scenario_seeds`), so the gate compares engines seed by seed and
  only the seeds where they differ carry evidence.
* **Per scenario** the candidate is held to production and, where the library recorded a
  confirmed fix by another version, to that fixer: a one-sided exact McNemar test on failed
  episodes, all such tests of the library together at family-wise level
  ``tests.scenario.alpha`` (Holm). Seeds come in stages (``evidence``); a scenario runs more
  only while a test is in doubt (:mod:`.gate_evidence`), and is tested once, on all of them.
* **Library-wide and per slice**, at-fault collisions: the pooled paired test against
  production on the first stage of seeds (``tests.library_at_fault``, ``tests.slice_at_fault``
  with Bonferroni over the gated slices).
* **Before the first release** production is model zero, which no car runs; the candidate is
  instead shown non-inferior to the oracle (ground-truth perception on the same seeds):
  :mod:`.gate_first_release`. Recorded fixes bind it too.
* The oracle and model zero are driven on the first stage of every scenario and reported as
  ceiling and floor.

The error rates this design has — how often it refuses an equal candidate and how often it
catches each regression it exists for — are measured through these functions by
``benchmarks/gate_calibration.py`` and stated in ``gates.yaml``. Every failure names the
scenario, slice or library rule that refused, so the report (and certification after it) can
say exactly why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .gate_comparison import GateResult, compare_outcomes, first_seeds
from .gate_first_release import first_release_test
from .gate_scenarios import scenario_tests
from .gate_settings import SimulationGate
from .gate_slices import library_at_fault_test, role_rates, slice_at_fault_tests
from .gate_verdicts import gate_section
from .roles import ROLE_FIXER, ROLE_PRODUCTION, ROLES


def evaluate_gate(
    outcomes: Sequence[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    gates: Mapping[str, Any] | None = None,
    *,
    first_release: bool = False,
    production_version: str | None = None,
) -> GateResult:
    """The regression gate over every simulated scenario; see the module docstring.

    ``first_release``: production is model zero (nothing released yet), so the candidate is
    judged against the oracle instead. ``production_version``: which model version production
    is (a fix by that version is held through the comparison with production).
    """
    section = gate_section(gates)
    settings = SimulationGate.from_section(section)
    levels = settings.levels
    comparisons = compare_outcomes(
        outcomes, records, section, production_version, first_release=first_release
    )
    failures: list[str] = []
    if not comparisons:
        failures.append("no scenarios were simulated: an empty library proves nothing")
    scenario_failures, tests = scenario_tests(comparisons, levels)
    failures += scenario_failures
    base = first_seeds(comparisons, settings.evidence.first_stage, first_release=first_release)
    aggregate = {**role_rates(base), **_evidence_figures(comparisons, settings)}
    if first_release:
        figures, failure = first_release_test(base, levels)
        reference = None  # production is model zero: slices are reported, not gated
    else:
        figures, failure = library_at_fault_test(base, ROLE_PRODUCTION, levels.library_alpha)
        reference = ROLE_PRODUCTION
    aggregate.update(figures)
    aggregate["first_release"] = first_release
    failures += [failure] if failure else []
    slices, slice_failures = slice_at_fault_tests(
        base, reference, levels.slice_alpha, levels.min_slice_scenarios
    )
    failures += slice_failures
    return GateResult(
        passed=not failures,
        failures=failures,
        comparisons=comparisons,
        aggregate=aggregate,
        slices=slices,
        tests=tests,
    )


def _evidence_figures(comparisons: Sequence[Any], settings: SimulationGate) -> dict[str, Any]:
    """How much evidence the sequential plan gathered: seeds per scenario and episodes."""
    seeds = [c.candidate_verdict.episodes for c in comparisons]
    first = settings.evidence.first_stage
    episodes = sum(
        result.episodes
        for c in comparisons
        for role in (*ROLES, ROLE_FIXER)
        if (result := c.result(role)) is not None
    )
    return {
        "seed_stages": list(settings.evidence.seed_stages),
        "confirmed_scenarios": sum(count > first for count in seeds),
        "mean_seeds": round(sum(seeds) / len(seeds), 3) if seeds else 0.0,
        "max_seeds": max(seeds, default=0),
        "candidate_episodes_all_stages": sum(seeds),
        "episodes_judged": episodes,
    }
