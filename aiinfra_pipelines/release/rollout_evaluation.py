"""Stage evaluation: judge the current stage on the telemetry published since it began.

A stage is judged only once both cohorts have their minimum sample; then every budget is
checked and any breach rolls back, a healthy stage asks for approval or widens. The same
telemetry commit is never decided on twice.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from .rollout_decision import Decision, Evidence, enter_stage, record_event, rolled_back
from .rollout_metrics import CohortMetrics, compare_cohorts, split_cohorts
from .rollout_settings import RolloutSettings, Stage
from .rollout_state import AWAITING_APPROVAL, RolloutState


def _nothing_to_evaluate(state: RolloutState, telemetry_commit: str | None) -> Decision | None:
    """Why there is nothing to judge (not active, or no fresh telemetry); ``None`` otherwise."""
    if not state.is_active:
        return Decision("none", f"rollout is {state.status}: nothing to evaluate")
    if telemetry_commit is None:
        return Decision("none", "no telemetry on main yet")
    if telemetry_commit == state.last_telemetry_commit:
        return Decision(
            "none",
            f"no fresh telemetry: {telemetry_commit[:12]} was already decided on",
            telemetry_commit,
        )
    return None


def _short_samples(
    stage: Stage | None,
    settings: RolloutSettings,
    candidate: CohortMetrics,
    control: CohortMetrics,
) -> list[str]:
    """Every minimum sample the stage has not reached yet (empty: it can be judged)."""
    short = []
    if stage is not None and candidate.frames < stage.min_candidate_frames:
        short.append(
            f"candidate cohort has {candidate.frames} frames (needs {stage.min_candidate_frames})"
        )
    if stage is not None and candidate.vehicles < stage.min_candidate_vehicles:
        short.append(
            f"candidate cohort has {candidate.vehicles} vehicles (needs "
            f"{stage.min_candidate_vehicles})"
        )
    if control.frames < settings.min_control_frames:
        short.append(
            f"control cohort has {control.frames} frames (needs {settings.min_control_frames})"
        )
    if stage is None or candidate.frames == 0:
        short.append("no telemetry from the candidate engine yet")
    return list(dict.fromkeys(short))


def _healthy_stage(
    state: RolloutState,
    settings: RolloutSettings,
    stage: Stage,
    evidence: Evidence,
    at: str,
    run_id: str,
) -> tuple[RolloutState, Decision]:
    """A healthy stage: hold while approval is pending, else ask for it or widen."""
    if state.status == AWAITING_APPROVAL:
        decision = evidence.decide("hold", "stage healthy; waiting for approval of the next stage")
        return record_event(
            state, "healthy", at, run_id, reason=decision.reason, decision=decision
        ), (decision)
    following = state.stage_index + 1
    if settings.needs_approval(following):
        new = replace(state, status=AWAITING_APPROVAL)
        upcoming = settings.stages[following]
        decision = evidence.decide(
            "await_approval",
            f"stage {stage.name} healthy; {upcoming.name} ({upcoming.percent:g} %) needs a "
            "recorded approval",
        )
        event = "awaiting_approval"
    else:
        new = enter_stage(state, settings, following, evidence.telemetry_commit)
        decision = evidence.decide(
            "advance", f"stage {stage.name} healthy; {new.stage} cohort {new.cohort_percent:g} %"
        )
        event = "stage_started"
    return record_event(new, event, at, run_id, reason=decision.reason, decision=decision), decision


def evaluate_stage(
    state: RolloutState,
    settings: RolloutSettings,
    *,
    telemetry_commit: str | None,
    records: pd.DataFrame,
    at: str,
    run_id: str = "",
) -> tuple[RolloutState, Decision]:
    """Judge the current stage on ``records``, the telemetry published since it began.

    ``records`` are split by the engine each vehicle actually ran: the candidate engine →
    candidate cohort, the production engine recorded in the state → control (see
    :func:`~.rollout_metrics.control_mask`); others (vehicles not yet updated) are ignored.
    """
    state.check_status()
    idle = _nothing_to_evaluate(state, telemetry_commit)
    if idle is not None:
        return state, idle
    new = replace(state, last_telemetry_commit=telemetry_commit)
    evidence = Evidence(telemetry_commit, *split_cohorts(state, records))
    stage = settings.stages[new.stage_index] if new.stage_index >= 0 else None
    short = _short_samples(stage, settings, evidence.candidate, evidence.control)
    if short or stage is None:
        decision = evidence.decide("wait", "; ".join(short))
        return record_event(
            new, "waiting", at, run_id, reason=decision.reason, decision=decision
        ), (decision)
    breaches = tuple(compare_cohorts(evidence.candidate, evidence.control, settings.budgets))
    if breaches:
        reason = "telemetry breach: " + "; ".join(b.message for b in breaches)
        decision = evidence.decide("rollback", reason, breaches)
        return rolled_back(new, decision, at, run_id), decision
    return _healthy_stage(new, settings, stage, evidence, at, run_id)
