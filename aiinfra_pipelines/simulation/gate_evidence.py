"""Which scenarios need more seeds, and which engines must drive them.

Evidence grows where a verdict is in doubt (``gates.yaml`` ``simulation.evidence``): after
each stage, a scenario whose candidate failed on more paired seeds than a reference it is held
to — by at least the stage's ``continue_z`` — runs the next stage, driven by the candidate and
by each such reference (their outcomes are paired seed by seed). A scenario where no test is in
doubt stops. This only decides how much evidence to gather: the tests run once, on all of it
(:mod:`.gate_scenarios`), so stopping for futility never raises the gate's level.

The same function decides for the shard that simulates (:mod:`.regression`) and for the
calibration that measures the gate's error rates (:mod:`.calibration`), so both follow one
procedure.
"""

from __future__ import annotations

from .gate_comparison import ScenarioComparison
from .gate_settings import EvidencePlan
from .roles import ROLE_CANDIDATE


def references_in_doubt(comparison: ScenarioComparison, plan: EvidencePlan) -> tuple[str, ...]:
    """The references whose test still needs seeds after the seeds this scenario ran (none
    once the last stage ran)."""
    seeds_run = comparison.candidate_verdict.episodes
    if plan.next_stage(seeds_run) is None:
        return ()
    threshold = plan.continue_threshold(seeds_run)
    return tuple(
        test.reference
        for test in comparison.tests
        if test.counts.discordant and test.counts.sign_z() >= threshold
    )


def next_request(comparison: ScenarioComparison, plan: EvidencePlan) -> tuple[int, tuple[str, ...]]:
    """(seeds the scenario runs next, roles that drive them), or ``(0, ())`` when it stops."""
    in_doubt = references_in_doubt(comparison, plan)
    if not in_doubt:
        return 0, ()
    stage = plan.next_stage(comparison.candidate_verdict.episodes)
    assert stage is not None  # references_in_doubt returns nothing after the last stage
    return stage, (ROLE_CANDIDATE, *in_doubt)
