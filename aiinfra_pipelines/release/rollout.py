"""Staged rollout: the state machine that widens, holds or rolls back a candidate engine.

One JSON document per candidate, ``release/rollout/<model_version>.json`` on ``main``, is the
record of truth (``docs/loop.md``); ``release/rollout/current.json`` names the rollout the fleet
follows. Statuses::

    shadow ──(shadow passed)──► in_progress ──(stage healthy)──► in_progress (next stage) …
                                   │   ▲                              │
                                   │   └──────(approval)─── awaiting_approval (next stage
                                   │                              │    needs a person)
                                   └──(breach / operator)──► rolled_back ◄──┘
    awaiting_approval ──(approval of the 100 % stage)──► completed ──(operator)──► rolled_back
    in_progress / awaiting_approval ──(a newer release gated against it starts)──► superseded

A stage is judged only on telemetry *published since it began* and only once the candidate
cohort (vehicles running the candidate engine) and the control cohort (vehicles running
production) both have their minimum sample; then every budget from ``gates.yaml`` is checked
and any breach rolls back. Each decision records the telemetry commit it used, and a
decision on the telemetry commit already decided is a no-op: the same telemetry never advances
a rollout twice. Entering a stage at or above ``approval_required_from_percent`` (and always
the 100 % stage) waits for a recorded approval; telemetry keeps being watched while it waits,
so a breach still rolls back.

One rollout widens at a time, with one exception: a newer candidate whose offline and
simulation gates were judged *against the release rolling out* (that release was its
reference, ``release.reference``) has shown itself at least as good as it, so it may take the
fleet over instead of waiting for days of approvals: the older rollout is ``superseded`` (its
cars return to production until the newer canary reaches them) and the newer one starts its
first stage. A candidate gated against anything else still waits.

Everything here is pure (:class:`~.rollout_state.RolloutState` in, a new state and a
:class:`Decision` out, ``at`` passed in); the ``rollout`` asset applies the side effects
(production pointer, registry). Settings, cohort metrics, telemetry readers and the lake
store of states live beside it: ``rollout_settings``, ``rollout_metrics``,
``rollout_telemetry``, ``rollout_store``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .rollout_decision import Action, Decision, enter_stage, record_event, rolled_back
from .rollout_settings import RolloutSettings
from .rollout_state import (
    AWAITING_APPROVAL,
    COMPLETED,
    ROLLED_BACK,
    SHADOW,
    SUPERSEDED,
    Approval,
    RolloutError,
    RolloutState,
)
from .rollout_store import version_order


def _with_production(
    state: RolloutState, production: Mapping[str, Any] | None, engine_sha256: str
) -> RolloutState:
    return replace(
        state,
        previous_production=str(production["version"]) if production else None,
        previous_production_pointer=dict(production) if production else None,
        production_engine_sha256=engine_sha256,
    )


def _shadow_reason(shadow: Mapping[str, Any]) -> str:
    if shadow.get("passed"):
        return (
            f"shadow passed on {shadow.get('frames')} frames, decision agreement "
            f"{float(shadow.get('decision_agreement', 0.0)):.1%}"
        )
    return "shadow did not pass: " + "; ".join(shadow.get("reasons") or ["no report"])


# ------------------------------------------------------------------------------------ shadow
def new_rollout_state(
    model_version: str,
    engine_sha256: str,
    *,
    engine_key: str,
    model_uri: str,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    shadow: Mapping[str, Any],
    at: str,
    run_id: str = "",
) -> RolloutState:
    """The state a certified candidate enters rollout with: ``shadow``, nothing installed.

    ``production`` is the production pointer at this moment (``None`` before the first release,
    when the fleet runs the bootstrap engine whose hash is ``production_engine_sha256``).
    """
    state = RolloutState(
        model_version=str(model_version),
        engine_sha256=engine_sha256,
        engine_key=engine_key,
        model_uri=model_uri,
        # Per rollout, so every candidate gets its own canary; derived (not random) so a re-run
        # of shadow for the same engine keeps the same cohorts.
        cohort_salt=f"rollout-{model_version}-{engine_sha256[:16]}",
        production_engine_sha256=production_engine_sha256,
        shadow=dict(shadow),
    )
    state = _with_production(state, production, production_engine_sha256)
    return record_event(state, "shadow", at, run_id, reason=_shadow_reason(shadow))


def refresh_shadow(
    state: RolloutState,
    shadow: Mapping[str, Any],
    *,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    at: str,
    run_id: str = "",
) -> RolloutState:
    """A re-run of shadow for a candidate still in shadow: new verdict, history kept."""
    if state.status != SHADOW:
        raise RolloutError(
            f"rollout of model version {state.model_version} is {state.status}; shadow "
            "can only be refreshed before the first stage"
        )
    new = _with_production(
        replace(state, shadow=dict(shadow)), production, production_engine_sha256
    )
    return record_event(new, "shadow", at, run_id, reason=_shadow_reason(shadow))


# ------------------------------------------------------------------------ start / supersede
def may_supersede(
    model_version: str, active_rollout: str | None, gated_against: str | None
) -> bool:
    """Whether a candidate may take the fleet over from ``active_rollout``: it is newer and
    its gates were judged against that very release (``gated_against``)."""
    return (
        active_rollout is not None
        and gated_against is not None
        and str(gated_against) == str(active_rollout)
        and version_order(model_version) > version_order(active_rollout)
    )


def _start_refusal(
    state: RolloutState, active_rollout: str | None, gated_against: str | None
) -> Decision | None:
    """Why ``state`` may not leave shadow now (``None``: it may)."""
    if state.status != SHADOW:
        return Decision("none", f"rollout is {state.status}, not in shadow")
    if not state.shadow_passed:
        return Decision("none", _shadow_reason(state.shadow))
    version = state.model_version
    if (
        active_rollout
        and active_rollout != version
        and not may_supersede(version, active_rollout, gated_against)
    ):
        gated = f"gated against {gated_against}" if gated_against else "gates' reference unknown"
        return Decision(
            "none",
            f"rollout of model version {active_rollout} is active; waiting for it to end "
            f"({gated}, so it cannot supersede it)",
        )
    return None


def start_rollout(
    state: RolloutState,
    settings: RolloutSettings,
    *,
    telemetry_commit: str | None,
    production: Mapping[str, Any] | None,
    production_engine_sha256: str,
    active_rollout: str | None,
    at: str,
    run_id: str = "",
    gated_against: str | None = None,
) -> tuple[RolloutState, Decision]:
    """Leave shadow for the first stage (or wait for approval if even that needs a person).

    Refused (``none``) while another rollout is active, unless this candidate was gated
    against that rollout's release (:func:`may_supersede`): then it starts, and the caller
    marks the older rollout with :func:`supersede_rollout` in the same published act. The
    production pointer is captured again here, since production may have changed while the
    candidate sat in shadow. Telemetry published before this moment never counts for the new
    stage.
    """
    state.check_status()
    refusal = _start_refusal(state, active_rollout, gated_against)
    if refusal is not None:
        return state, refusal
    superseding = may_supersede(state.model_version, active_rollout, gated_against)
    new = replace(
        _with_production(state, production, production_engine_sha256),
        last_telemetry_commit=telemetry_commit,
        stage_started_telemetry_commit=telemetry_commit,
        supersedes=active_rollout if superseding else None,
    )
    takeover = (
        f"; supersedes the rollout of model version {active_rollout}, its gates' reference"
        if superseding
        else ""
    )
    first = settings.stages[0]
    if settings.needs_approval(0):
        new = replace(new, status=AWAITING_APPROVAL)
        decision = Decision(
            "await_approval", f"stage {first.name} needs approval{takeover}", telemetry_commit
        )
        return record_event(new, "awaiting_approval", at, run_id, reason=decision.reason), decision
    new = enter_stage(new, settings, 0, telemetry_commit)
    decision = Decision(
        "start",
        f"shadow passed; {first.name} cohort {first.percent:g} %{takeover}",
        telemetry_commit,
    )
    return record_event(new, "stage_started", at, run_id, reason=decision.reason), decision


def supersede_rollout(
    state: RolloutState, *, by_version: str, at: str, run_id: str = ""
) -> RolloutState:
    """The older rollout's state once ``by_version`` (gated against it) took the fleet over:
    no cohort any more, history kept; never production, so nothing to restore."""
    state.check_status()
    if not state.is_active:
        raise RolloutError(
            f"rollout of model version {state.model_version} is {state.status}; only an "
            "active rollout can be superseded"
        )
    new = replace(state, status=SUPERSEDED, cohort_percent=0.0, superseded_by=str(by_version))
    return record_event(
        new,
        "superseded",
        at,
        run_id,
        reason=f"model version {by_version}, gated against this release, started its rollout",
        superseded_from=state.status,
    )


# ------------------------------------------------------------------ approval / rollback
def approve_next_stage(
    state: RolloutState,
    settings: RolloutSettings,
    *,
    approver: str,
    telemetry_commit: str | None,
    at: str,
    run_id: str = "",
) -> tuple[RolloutState, Decision]:
    """Record a person's approval and enter the stage that was waiting for it.

    Only an ``awaiting_approval`` rollout can be approved (an approval given early is refused,
    not kept for later); approving the 100 % stage completes the rollout. Repeating the same
    approval after it took effect changes nothing.
    """
    state.check_status()
    approver = approver.strip()
    if not approver:
        raise RolloutError("an approval needs the approver's name")
    if state.status == COMPLETED and state.approval and state.approval.approver == approver:
        return state, Decision("none", f"already approved by {approver} and completed")
    if state.status != AWAITING_APPROVAL:
        raise RolloutError(
            f"rollout of model version {state.model_version} is {state.status} at stage "
            f"{state.stage}; an approval is only accepted while awaiting_approval"
        )
    new = enter_stage(state, settings, state.stage_index + 1, telemetry_commit)
    new = replace(new, approval=Approval(approver=approver, at=at, stage=new.stage))
    action: Action = "complete" if new.status == COMPLETED else "advance"
    decision = Decision(
        action,
        f"approved by {approver}: {new.stage} cohort {new.cohort_percent:g} %",
        telemetry_commit,
    )
    new = record_event(new, "approved", at, run_id, reason=decision.reason, approver=approver)
    if action == "complete":
        reason = f"model version {new.model_version} is production on the whole fleet"
        new = record_event(new, "completed", at, run_id, reason=reason)
    return new, decision


def roll_back(
    state: RolloutState, *, reason: str, at: str, run_id: str = ""
) -> tuple[RolloutState, Decision]:
    """An operator's rollback (any status but ``rolled_back``), recorded with its reason."""
    state.check_status()
    if not reason.strip():
        raise RolloutError("a rollback needs a reason")
    if state.status == ROLLED_BACK:
        return state, Decision("none", "already rolled back")
    decision = Decision("rollback", f"operator rollback: {reason.strip()}")
    return rolled_back(state, decision, at, run_id), decision


def production_pointer(manifest: Mapping[str, Any], commit: str) -> dict[str, Any]:
    """The ``release/production.json`` document for a candidate manifest (docs/loop.md)."""
    ship = manifest["ship"]
    return {
        "version": str(manifest["model_version"]),
        "onnx_key": str(ship["key"]),
        "engine_sha256": str(ship["sha256"]),
        "commit": commit,
        "model_uri": str(manifest.get("model_uri") or ""),
    }
