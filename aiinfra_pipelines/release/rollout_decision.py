"""Rollout decisions and the state edits every transition shares.

A :class:`Decision` is what one step decided and on which telemetry; it is written into the
state's history (``record_event``) so every stage change can be audited later from the lake
alone. The shadow/start/approval transitions (``rollout.py``) and stage evaluation
(``rollout_evaluation.py``) both build on these edits, which is why they live apart from both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from .rollout_judgement import StageJudgement
from .rollout_metrics import Breach, CohortMetrics, confidence_psi
from .rollout_settings import RolloutSettings
from .rollout_state import COMPLETED, IN_PROGRESS, ROLLED_BACK, RolloutState

Action = Literal[
    "none", "wait", "start", "advance", "await_approval", "hold", "complete", "rollback"
]


@dataclass(frozen=True)
class Decision:
    """What one rollout evaluation decided, and on which evidence."""

    action: Action
    reason: str
    telemetry_commit: str | None = None
    candidate: CohortMetrics | None = None
    control: CohortMetrics | None = None
    breaches: tuple[Breach, ...] = ()
    # Every metric's sequential test on the stage's telemetry (None: nothing was judged).
    judgement: StageJudgement | None = None

    @property
    def changed_state(self) -> bool:
        return self.action != "none"

    def as_dict(self) -> dict[str, Any]:
        psi_value = (
            confidence_psi(self.candidate, self.control)
            if self.candidate is not None and self.control is not None
            else None
        )
        return {
            "action": self.action,
            "reason": self.reason,
            "telemetry_commit": self.telemetry_commit,
            "candidate": self.candidate.as_dict() if self.candidate else None,
            "control": self.control.as_dict() if self.control else None,
            "confidence_psi": psi_value,
            "breaches": [breach.as_dict() for breach in self.breaches],
            "tests": None if self.judgement is None else self.judgement.as_dict(),
            "exposure_frames": None if self.candidate is None else self.candidate.frames,
            "exposure_needed_frames": (
                None if self.judgement is None else self.judgement.exposure_needed_frames
            ),
        }


@dataclass(frozen=True)
class Evidence:
    """The telemetry one stage evaluation rests on; every decision it yields cites it."""

    telemetry_commit: str | None
    candidate: CohortMetrics
    control: CohortMetrics
    judgement: StageJudgement | None = None

    def decide(self, action: Action, reason: str, breaches: tuple[Breach, ...] = ()) -> Decision:
        return Decision(
            action,
            reason,
            self.telemetry_commit,
            self.candidate,
            self.control,
            breaches,
            self.judgement,
        )


def record_event(
    state: RolloutState,
    event: str,
    at: str,
    run_id: str,
    *,
    reason: str = "",
    decision: Decision | None = None,
    **extra: Any,
) -> RolloutState:
    """``state`` with one history entry appended, describing where it stands after ``event``."""
    entry = {
        "event": event,
        "at": at,
        "stage_index": state.stage_index,
        "stage": state.stage,
        "cohort_percent": state.cohort_percent,
        "status": state.status,
        "reason": reason,
        "dagster_run_id": run_id,
        **extra,
    }
    if decision is not None:
        entry["decision"] = decision.as_dict()
    return replace(state, history=(*state.history, entry))


def enter_stage(
    state: RolloutState, settings: RolloutSettings, index: int, telemetry_commit: str | None
) -> RolloutState:
    """``state`` in stage ``index``: cohort widened, and the telemetry window restarted at
    ``telemetry_commit`` so nothing published before the stage began counts for it."""
    stage = settings.stages[index]
    return replace(
        state,
        stage_index=index,
        stage=stage.name,
        cohort_percent=stage.percent,
        status=COMPLETED if stage.percent >= 100.0 else IN_PROGRESS,
        stage_started_telemetry_commit=telemetry_commit,
        last_telemetry_commit=telemetry_commit,
    )


def rolled_back(state: RolloutState, decision: Decision, at: str, run_id: str) -> RolloutState:
    """``state`` rolled back (cohort emptied), recording what it was and which production
    release the fleet returns to."""
    new = replace(state, status=ROLLED_BACK, cohort_percent=0.0)
    return record_event(
        new,
        "rolled_back",
        at,
        run_id,
        reason=decision.reason,
        decision=decision,
        rolled_back_from=state.status,
        restored_production=state.previous_production,
    )
