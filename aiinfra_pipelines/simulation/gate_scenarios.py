"""Per scenario: is the candidate worse than a reference it is held to, beyond chance?

Each binding reference of each scenario (production; the version that fixed it) is one test:
the one-sided exact McNemar test on the failed episodes paired by seed
(:class:`.gate_comparison.PairedTest`). A library tests dozens at once, so the family of all
those tests is held to ``tests.scenario.alpha`` with Holm's step-down procedure: an equal
candidate is refused by any of them together at most that often. A test is made once, on all
seeds the scenario ran; the stages before only decided whether to run more
(:mod:`.gate_evidence`), never to refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiinfra_pipelines.statistics.multiplicity import holm_level, holm_rejections

from .gate_comparison import PairedTest, ScenarioComparison
from .gate_settings import GateLevels
from .roles import ROLE_FIXER


def scenario_tests(
    comparisons: Sequence[ScenarioComparison], levels: GateLevels
) -> tuple[list[str], list[dict[str, Any]]]:
    """(failures, one row per test) for every binding (scenario, reference) test.

    Each row carries the paired counts, the p-value, the level Holm held it to and whether it
    found a regression; each regression is one failure naming the scenario and reference.
    """
    by_key = {test.key: (test, c) for c in comparisons for test in c.tests}
    p_values = {key: test.p_value for key, (test, _) in by_key.items()}
    rejected = holm_rejections(p_values, levels.scenario_alpha) if p_values else {}
    failures, rows = [], []
    for key, (test, comparison) in by_key.items():
        level = holm_level(p_values, key, levels.scenario_alpha)
        regressed = key in rejected
        rows.append(
            {
                "scenario_id": test.scenario_id,
                "slice": comparison.slice,
                **test.to_dict(),
                "seeds": comparison.candidate_verdict.episodes,
                "holm_level": level,
                "regressed": regressed,
            }
        )
        if regressed:
            failures.append(_failure(test, comparison, level))
    return failures, rows


def _failure(test: PairedTest, comparison: ScenarioComparison, level: float) -> str:
    what = (
        f"regressed fix of model version {test.reference_version}"
        if test.reference == ROLE_FIXER
        else "worse than production"
    )
    why = "; ".join(comparison.candidate_verdict.failures[:3])
    more = len(comparison.candidate_verdict.failures) - 3
    if more > 0:
        why += f"; … {more} more"
    return (
        f"scenario {test.scenario_id}: {what}: {test.describe()} (exact McNemar "
        f"p = {test.p_value:.2g} <= Holm level {level:.2g}): {why}"
    )
