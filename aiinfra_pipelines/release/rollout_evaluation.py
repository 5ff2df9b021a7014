"""Stage evaluation: judge the current stage on the telemetry published since it began.

Every publish updates the stage's sequential tests (:mod:`.rollout_judgement`): harm shown on
any metric rolls back; non-inferiority shown on every metric makes the stage healthy (it asks
for approval or widens); anything else keeps collecting and says how much more exposure a
decision needs. The same telemetry commit is never decided on twice.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from .rollout_decision import Decision, Evidence, enter_stage, record_event, rolled_back
from .rollout_judgement import StageJudgement, judge_stage
from .rollout_metrics import CohortMetrics, cohort_metrics, cohort_records
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
    if (
        stage is not None
        and stage.min_candidate_frames
        and (candidate.frames < stage.min_candidate_frames)
    ):
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


def _looks_in_stage(state: RolloutState) -> int:
    """How many times the current stage has been judged before (its decisions since it began)."""
    looks = 0
    for entry in reversed(state.history):
        if entry.get("event") == "stage_started":
            break
        if entry.get("decision"):
            looks += 1
    return looks


def _past_cap(stage: Stage, judgement: StageJudgement) -> str:
    if stage.exposure_cap_frames and judgement.candidate_frames >= stage.exposure_cap_frames:
        return (
            f"; past the stage's exposure cap of {stage.exposure_cap_frames:,} candidate frames "
            "(gates.yaml exposure_cap_factor): the operator decides"
        )
    return ""


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
    candidate, control = cohort_records(state, records)
    stage = settings.stages[new.stage_index] if new.stage_index >= 0 else None
    judgement = judge_stage(settings, candidate, control, _looks_in_stage(state) + 1)
    evidence = Evidence(
        telemetry_commit, cohort_metrics(candidate), cohort_metrics(control), judgement
    )
    short = _short_samples(stage, settings, evidence.candidate, evidence.control)
    if short or stage is None:
        decision = evidence.decide("wait", "; ".join(short))
        return record_event(
            new, "waiting", at, run_id, reason=decision.reason, decision=decision
        ), (decision)
    breaches = judgement.harms
    if breaches:
        reason = "harm shown: " + "; ".join(b.message for b in breaches)
        decision = evidence.decide("rollback", reason, breaches)
        return rolled_back(new, decision, at, run_id), decision
    if not judgement.non_inferior:
        decision = evidence.decide("wait", judgement.summary() + _past_cap(stage, judgement))
        return record_event(
            new, "waiting", at, run_id, reason=decision.reason, decision=decision
        ), (decision)
    return _healthy_stage(new, settings, stage, evidence, at, run_id)
