"""The work behind the ``rollout`` asset, as plain functions.

One materialization is one step: pick the rollout to act on (:func:`load_target`), decide
(:func:`decide_step`: an operator's rollback, a forced rollback when the certificate no longer
verifies, an approval, leaving shadow, or judging the stage), publish the new states and any
production pointer change in one act (:func:`publish_step`), then make the registry agree
(:func:`reconcile_registry`). Kept out of the asset body so each part reads (and tests) alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import (
    CURRENT_ROLLOUT_KEY,
    MAIN_BRANCH,
    PRODUCTION_POINTER_KEY,
    candidate_manifest_key,
    rollout_state_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_with_run_branch
from aiinfra_pipelines.perception.deployed import load_deployed_engine

from .certificate import CertificateError, verify_certificate
from .reference import gated_against
from .registry import CANDIDATE_ALIAS, PRODUCTION_ALIAS, ModelRegistry
from .rollout import (
    approve_next_stage,
    production_pointer,
    roll_back,
    start_rollout,
    supersede_rollout,
)
from .rollout_decision import Decision
from .rollout_evaluation import evaluate_stage
from .rollout_settings import RolloutSettings
from .rollout_state import COMPLETED, ROLLED_BACK, SHADOW, SUPERSEDED, RolloutState
from .rollout_store import active_rollout, list_states, read_current, read_state
from .rollout_telemetry import latest_telemetry_commit, next_telemetry_commit, telemetry_since
from .shadow_run import production_pointer_now

ROLLOUT_TAG_PREFIX = "rollout_"


class RolloutRefused(RuntimeError):
    """No rollout to act on as asked (the message says why); not worth a retry."""


@dataclass(frozen=True)
class RolloutRequest:
    """What an operator asked of this step (all empty: just judge the current rollout)."""

    model_version: str = ""
    approved_by: str = ""
    rollback_reason: str = ""


@dataclass(frozen=True)
class RolloutStep:
    """One step's outcome: the state before and after, why, and any rollout it superseded."""

    before: RolloutState
    after: RolloutState
    decision: Decision
    superseded: RolloutState | None = None

    @property
    def model_version(self) -> str:
        return self.after.model_version


def target_version(lake: VersionedLake, requested: str) -> str:
    """The requested version, else the current active rollout, else the newest candidate in
    shadow, else the current rollout whatever its status."""
    if requested:
        return requested
    current = read_current(lake)
    if current is not None and current.is_active:
        return current.model_version
    waiting = [s for s in list_states(lake) if s.status == SHADOW]
    if waiting:
        return waiting[-1].model_version
    if current is not None:
        return current.model_version
    raise RolloutRefused(
        "no rollout to act on: no current rollout and no candidate in shadow "
        "(materialize shadow_report for a certified candidate first)"
    )


def load_target(lake: VersionedLake, requested: str) -> RolloutState:
    model_version = target_version(lake, requested)
    state = read_state(lake, model_version)
    if state is None:
        raise RolloutRefused(
            f"model version {model_version} has no rollout state: materialize "
            "shadow_report for it first"
        )
    return state


def decide_step(
    lake: VersionedLake,
    state: RolloutState,
    settings: RolloutSettings,
    request: RolloutRequest,
    public_key: Callable[[], Ed25519PublicKey],
    *,
    at: str,
    run_id: str,
) -> RolloutStep:
    """The state machine step this materialization asks for.

    Only an operator's rollback skips the certificate check: pulling an engine must never be
    blocked by a broken certificate (nor by the key store: ``public_key`` is only called
    when the certificate is checked). An active rollout whose certificate no longer verifies is
    rolled back (an engine on cars must stay certified); any other state refuses to act.
    """
    if request.rollback_reason:
        new, decision = roll_back(state, reason=request.rollback_reason, at=at, run_id=run_id)
        return RolloutStep(state, new, decision)
    try:
        verify_certificate(lake, state.model_version, public_key())
    except CertificateError as error:
        if not state.is_active:
            raise
        reason = f"certificate no longer verifies: {error}"
        new, decision = roll_back(state, reason=reason, at=at, run_id=run_id)
        return RolloutStep(state, new, decision)
    if request.approved_by:
        new, decision = approve_next_stage(
            state,
            settings,
            approver=request.approved_by,
            telemetry_commit=latest_telemetry_commit(lake),
            at=at,
            run_id=run_id,
        )
        return RolloutStep(state, new, decision)
    if state.status == SHADOW:
        return _start(lake, state, settings, latest_telemetry_commit(lake), at, run_id)
    # A stage is judged publish by publish, oldest first (rollout_telemetry): the records
    # since the stage began, up to the next publish not yet decided on.
    judged = next_telemetry_commit(lake, after=state.last_telemetry_commit)
    new, decision = evaluate_stage(
        state,
        settings,
        telemetry_commit=judged,
        records=telemetry_since(lake, state.stage_started_telemetry_commit, judged),
        at=at,
        run_id=run_id,
    )
    return RolloutStep(state, new, decision)


def _start(
    lake: VersionedLake,
    state: RolloutState,
    settings: RolloutSettings,
    telemetry_commit: str | None,
    at: str,
    run_id: str,
) -> RolloutStep:
    """Leave shadow; if the candidate takes over an active rollout, that rollout's state too."""
    new, decision = start_rollout(
        state,
        settings,
        telemetry_commit=telemetry_commit,
        production=production_pointer_now(lake),
        production_engine_sha256=load_deployed_engine(lake).engine.sha256,
        active_rollout=active_rollout(list_states(lake)),
        gated_against=gated_against(lake, state.model_version),
        at=at,
        run_id=run_id,
    )
    superseded = None
    if decision.changed_state and new.supersedes:
        older = read_state(lake, new.supersedes)
        if older is None:
            raise RolloutRefused(f"superseded rollout {new.supersedes} has no state")
        superseded = supersede_rollout(older, by_version=new.model_version, at=at, run_id=run_id)
    return RolloutStep(state, new, decision, superseded)


def pointer_changes(lake: VersionedLake, step: RolloutStep) -> tuple[dict[str, bytes], list[str]]:
    """The production pointer writes a decision implies: promote on completion, restore the
    previous pointer (or remove it: bootstrap) when a completed rollout is rolled back."""
    if step.decision.action == "complete":
        manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(step.model_version))
        pointer = production_pointer(manifest, lake.resolve_ref(MAIN_BRANCH))
        return {PRODUCTION_POINTER_KEY: json_document(pointer)}, []
    if step.decision.action == "rollback" and step.before.was_production:
        previous = step.after.previous_production_pointer
        if previous:
            return {PRODUCTION_POINTER_KEY: json_document(previous)}, []
        return {}, [PRODUCTION_POINTER_KEY]
    return {}, []


def publish_step(lake: VersionedLake, step: RolloutStep, root_run_id: str, run_id: str) -> str:
    """States, ``current.json`` and the production pointer reach ``main`` in one act."""
    new, version = step.after, step.model_version
    puts, deletes = pointer_changes(lake, step)
    puts[rollout_state_key(version)] = json_document(new.to_json())
    if step.superseded is not None:
        older = step.superseded
        puts[rollout_state_key(older.model_version)] = json_document(older.to_json())
    if new.status != SHADOW:
        puts[CURRENT_ROLLOUT_KEY] = json_document({"model_version": version})
    return publish_with_run_branch(
        lake,
        root_run_id,
        puts,
        f"rollout {version}: {step.decision.action} ({new.status}, {new.stage})",
        {
            "kind": "rollout",
            "model_version": version,
            "action": step.decision.action,
            "status": new.status,
            "stage": new.stage,
            "telemetry_commit": step.decision.telemetry_commit or "",
            "dagster_run_id": run_id,
        },
        deletes=deletes,
    )


def registry_tags(state: RolloutState) -> dict[str, str]:
    """The ``rollout_*`` tags the registry carries for ``state``."""
    tags = {
        f"{ROLLOUT_TAG_PREFIX}status": state.status,
        f"{ROLLOUT_TAG_PREFIX}stage": state.stage,
        f"{ROLLOUT_TAG_PREFIX}cohort_percent": f"{float(state.cohort_percent):g}",
    }
    if state.approval:
        tags[f"{ROLLOUT_TAG_PREFIX}approved_by"] = state.approval.approver
        tags[f"{ROLLOUT_TAG_PREFIX}approved_at"] = state.approval.at
    if state.status == ROLLED_BACK:
        reason = str(state.last_event.get("reason", ""))[:4000]
        tags[f"{ROLLOUT_TAG_PREFIX}rollback_reason"] = reason
        tags[f"{ROLLOUT_TAG_PREFIX}restored_production"] = str(state.previous_production)
    if state.status == SUPERSEDED:
        tags[f"{ROLLOUT_TAG_PREFIX}superseded_by"] = str(state.superseded_by or "")
    return tags


def reconcile_registry(registry: ModelRegistry, state: RolloutState) -> dict[str, str]:
    """Make the registry say what the rollout state says (idempotent); returns the tags set.

    Run after every step, changed or not, so a registry hiccup heals on the next
    materialization instead of leaving registry and lake disagreeing.
    """
    version = state.model_version
    tags = registry_tags(state)
    registry.set_tags(version, tags)
    if state.status == COMPLETED:
        registry.set_alias(PRODUCTION_ALIAS, version)
        if registry.get_alias(CANDIDATE_ALIAS) == version:
            registry.delete_alias(CANDIDATE_ALIAS)
    elif state.status in (ROLLED_BACK, SUPERSEDED):
        if registry.get_alias(CANDIDATE_ALIAS) == version:
            registry.delete_alias(CANDIDATE_ALIAS)
        if registry.get_alias(PRODUCTION_ALIAS) == version:
            if state.previous_production:
                registry.set_alias(PRODUCTION_ALIAS, state.previous_production)
            else:
                registry.delete_alias(PRODUCTION_ALIAS)
    return tags
