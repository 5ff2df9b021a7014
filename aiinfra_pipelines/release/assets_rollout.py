"""``shadow_report`` and ``rollout`` (group ``release``): thin assets over shadow.py/rollout.py.

Both verify the candidate's certificate (signature and every hash it binds) before they act;
only an operator's rollback skips that, because pulling an engine must never be blocked by a
broken certificate. Every state change reaches ``main`` in one published act (state, pointer,
``current.json`` together), and the MLflow registry is then reconciled with the state, so a
registry hiccup heals on the next materialization instead of leaving the two disagreeing.
"""

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import parquet_bytes, read_parquet_prefix
from aiinfra_pipelines.lake.layout import PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, root_run_id_of
from aiinfra_pipelines.mining.engine_runner import perceive_frames
from aiinfra_pipelines.mining.settings import mining_config
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines.training.resources import MlflowTracking

from .assets_certification import certified_engine
from .certificate import CertificateError, latest_candidate, manifest_key, verify_certificate
from .keys import ReleaseKeys
from .reference import gated_against
from .registry import CANDIDATE_ALIAS, PRODUCTION_ALIAS, ModelRegistry
from .rollout import (
    ACTIVE_STATUSES,
    COMPLETED,
    CURRENT_ROLLOUT_KEY,
    PUBLISHED_TELEMETRY_PREFIX,
    ROLLED_BACK,
    SHADOW,
    SUPERSEDED,
    Decision,
    RolloutSettings,
    active_rollout,
    approve_next_stage,
    evaluate_stage,
    latest_telemetry_commit,
    list_states,
    new_rollout_state,
    production_pointer,
    publish_changes,
    read_current,
    read_state,
    refresh_shadow,
    roll_back,
    rollout_state_key,
    start_rollout,
    supersede_rollout,
    telemetry_since,
    was_production,
)
from .shadow import (
    ShadowSettings,
    compare_engines,
    per_slice_table,
    recent_rows,
    shadow_agreement,
    shadow_badcases,
    shadow_badcases_key,
    shadow_report_key,
    shadow_summary,
)

GROUP = "release"
ROLLOUT_TAG_PREFIX = "rollout_"


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=2, default=str) + "\n").encode()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _md(table: pd.DataFrame) -> dg.MetadataValue:
    return dg.MetadataValue.md(table.to_markdown(index=False) if len(table) else "none")


def _candidate_engine(lake: VersionedLake, certificate: dict[str, Any]) -> OnnxRuntimeEngine:
    """The certified engine bytes (``verify_certificate`` already matched their hash)."""
    engine = certificate["engine"]
    return OnnxRuntimeEngine(
        lake.get_object(MAIN_BRANCH, engine["key"]),
        perception_spec(),
        name=str(certificate["model_version"]),
        batch_size=int(mining_config()["engine"]["batch_size"]),
    )


class ShadowConfig(dg.Config):
    """Which certified candidate to shadow; empty = the newest published candidate."""

    model_version: str = ""


@dg.asset(group_name=GROUP, kinds={"onnx", "lakefs"}, deps=[certified_engine])
def shadow_report(
    context: dg.AssetExecutionContext,
    config: ShadowConfig,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    release_keys: ReleaseKeys,
) -> dg.MaterializeResult:
    """The certified candidate beside production on recent fleet logs: decision agreement,
    occupancy agreement, confidence shift per slice; disagreements mined back as badcases.

    Creates the candidate's rollout state (status ``shadow``) the first time; re-running it
    while the candidate is still in shadow refreshes the verdict, later it only re-reports.
    """
    model_version = config.model_version or latest_candidate(lake)
    certificate = verify_certificate(lake, model_version, release_keys.certificate_public_key())
    settings = ShadowSettings.from_gates()
    registry = ModelRegistry(mlflow_tracking.uri())
    registry.version(model_version)  # unregistered → a clear error before anything is written
    candidate = _candidate_engine(lake, certificate)
    production = load_deployed_engine(lake, batch_size=int(mining_config()["engine"]["batch_size"]))
    rows = recent_rows(
        scene_index_view(lake), settings.max_logs, settings.max_age_days, settings.max_frames
    )
    if rows.empty:
        raise dg.Failure(
            description="no published fleet logs on main: shadow mode needs recent frames",
            allow_retries=False,
        )
    frames = load_frames(lake, rows, MAIN_BRANCH)
    spec = perception_spec()
    comparison = compare_engines(
        frames,
        perceive_frames(production.engine, frames, spec),
        perceive_frames(candidate, frames, spec),
        settings,
    )
    summary = shadow_summary(comparison, settings)
    # Cars that already ran this engine in shadow mode on the road (vehicle-side telemetry).
    fleet_shadow = shadow_agreement(
        read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    ).get(candidate.sha256)
    per_slice = per_slice_table(comparison)
    badcases = shadow_badcases(comparison, model_version, candidate.sha256)
    report = {
        "model_version": model_version,
        "passed": summary["passed"],
        "engine_sha256": candidate.sha256,
        "certificate_sha256": certificate["certificate_sha256"],
        "production_version": production.version,
        "production_engine_sha256": production.engine.sha256,
        "window": {
            "logs": sorted(rows["log_id"].unique().tolist()),
            "newest_recorded_at": str(rows["recorded_at"].max()),
            "main_commit": lake.resolve_ref(MAIN_BRANCH),
        },
        "summary": summary,
        "fleet_shadow": fleet_shadow,
        "per_slice": per_slice.to_dict(orient="records"),
        "badcases_key": shadow_badcases_key(model_version),
        "dagster_run_id": context.run.run_id,
    }
    report_bytes = _json_bytes(report)
    objects = {
        shadow_report_key(model_version): report_bytes,
        shadow_badcases_key(model_version): parquet_bytes(badcases),
    }
    shadow_record = {
        "passed": summary["passed"],
        "reasons": summary["reasons"],
        "frames": summary["frames"],
        "decision_agreement": summary.get("decision_agreement"),
        "report_key": shadow_report_key(model_version),
    }
    state = read_state(lake, model_version)
    pointer = (
        lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
        if lake.object_exists(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
        else None
    )
    state_note = f"state unchanged: rollout is {state['status']}" if state else ""
    if state is None:
        manifest = lake.get_json(MAIN_BRANCH, manifest_key(model_version))
        state = new_rollout_state(
            model_version,
            candidate.sha256,
            engine_key=certificate["engine"]["key"],
            model_uri=str(manifest.get("model_uri") or ""),
            production=pointer,
            production_engine_sha256=production.engine.sha256,
            shadow=shadow_record,
            at=_now(),
            run_id=context.run.run_id,
        )
        state_note = "rollout state created: shadow"
    elif state["status"] == SHADOW:
        state = refresh_shadow(
            state,
            shadow_record,
            production=pointer,
            production_engine_sha256=production.engine.sha256,
            at=_now(),
            run_id=context.run.run_id,
        )
        state_note = "shadow verdict refreshed"
    if state["status"] == SHADOW:
        objects[rollout_state_key(model_version)] = _json_bytes(state)
    commit = publish_changes(
        lake,
        root_run_id_of(context.run),
        objects,
        [],
        f"shadow report for model version {model_version}: "
        f"{'passed' if summary['passed'] else 'not passed'}",
        {"kind": "shadow", "model_version": model_version, "dagster_run_id": context.run.run_id},
    )
    registry.set_tags(
        model_version,
        {
            "shadow_passed": str(summary["passed"]).lower(),
            "shadow_decision_agreement": f"{summary.get('decision_agreement', 0.0):.4f}",
            "shadow_report_key": shadow_report_key(model_version),
            "shadow_report_sha256": hashlib.sha256(report_bytes).hexdigest(),
        },
    )
    return dg.MaterializeResult(
        metadata={
            "model_version": model_version,
            "passed": summary["passed"],
            "reasons": dg.MetadataValue.json(summary["reasons"]),
            "frames": summary["frames"],
            "logs": summary["logs"],
            "decision_agreement": summary.get("decision_agreement", 0.0),
            "occupancy_agreement": summary.get("occupancy_agreement", 0.0),
            "production_fallback_rate": summary.get("production_fallback_rate", 0.0),
            "candidate_fallback_rate": summary.get("candidate_fallback_rate", 0.0),
            "confidence": dg.MetadataValue.json(summary.get("confidence", {})),
            "action_changes": dg.MetadataValue.json(summary.get("action_changes", {})),
            "fleet_shadow": dg.MetadataValue.json(fleet_shadow or {}),
            "per_slice": _md(per_slice.round(4)),
            "badcases": len(badcases),
            "production": production.version,
            "state": state_note,
            "main_commit": commit,
            "report": f"lakefs://{lake.repository}/{commit}/{shadow_report_key(model_version)}",
        }
    )


class RolloutConfig(dg.Config):
    """One rollout step. Empty ``model_version``: the current rollout, else the newest
    candidate still in shadow. ``approved_by``: the approver's name, to enter a stage that
    waits for approval (the full fleet always does). ``rollback_reason``: roll back now."""

    model_version: str = ""
    approved_by: str = ""
    rollback_reason: str = ""


def _target_version(lake: VersionedLake, requested: str) -> str:
    if requested:
        return requested
    current = read_current(lake)
    if current is not None and current["status"] in ACTIVE_STATUSES:
        return str(current["model_version"])
    waiting = [s for s in list_states(lake) if s["status"] == SHADOW]
    if waiting:
        return str(waiting[-1]["model_version"])
    if current is not None:
        return str(current["model_version"])
    raise dg.Failure(
        description="no rollout to act on: no current rollout and no candidate in shadow "
        "(materialize shadow_report for a certified candidate first)",
        allow_retries=False,
    )


def reconcile_registry(registry: ModelRegistry, state: dict[str, Any]) -> dict[str, str]:
    """Make the registry say what the rollout state says (idempotent); returns the tags set."""
    version = str(state["model_version"])
    tags = {
        f"{ROLLOUT_TAG_PREFIX}status": state["status"],
        f"{ROLLOUT_TAG_PREFIX}stage": state["stage"],
        f"{ROLLOUT_TAG_PREFIX}cohort_percent": f"{float(state['cohort_percent']):g}",
    }
    if state.get("approval"):
        tags[f"{ROLLOUT_TAG_PREFIX}approved_by"] = state["approval"]["approver"]
        tags[f"{ROLLOUT_TAG_PREFIX}approved_at"] = state["approval"]["at"]
    last = state["history"][-1] if state["history"] else {}
    if state["status"] == ROLLED_BACK:
        tags[f"{ROLLOUT_TAG_PREFIX}rollback_reason"] = str(last.get("reason", ""))[:4000]
        tags[f"{ROLLOUT_TAG_PREFIX}restored_production"] = str(state["previous_production"])
    if state["status"] == SUPERSEDED:
        tags[f"{ROLLOUT_TAG_PREFIX}superseded_by"] = str(state.get("superseded_by", ""))
    registry.set_tags(version, tags)
    if state["status"] == COMPLETED:
        registry.set_alias(PRODUCTION_ALIAS, version)
        if registry.get_alias(CANDIDATE_ALIAS) == version:
            registry.delete_alias(CANDIDATE_ALIAS)
    elif state["status"] in (ROLLED_BACK, SUPERSEDED):
        if registry.get_alias(CANDIDATE_ALIAS) == version:
            registry.delete_alias(CANDIDATE_ALIAS)
        if registry.get_alias(PRODUCTION_ALIAS) == version:
            previous = state.get("previous_production")
            if previous:
                registry.set_alias(PRODUCTION_ALIAS, str(previous))
            else:
                registry.delete_alias(PRODUCTION_ALIAS)
    return tags


def _pointer_changes(
    lake: VersionedLake, before: dict[str, Any], after: dict[str, Any], decision: Decision
) -> tuple[dict[str, bytes], list[str]]:
    """The production pointer writes a decision implies: promote on completion, restore the
    previous pointer (or remove it: bootstrap) when a completed rollout is rolled back."""
    if decision.action == "complete":
        manifest = lake.get_json(MAIN_BRANCH, manifest_key(after["model_version"]))
        pointer = production_pointer(manifest, lake.resolve_ref(MAIN_BRANCH))
        return {PRODUCTION_POINTER_KEY: _json_bytes(pointer)}, []
    if decision.action == "rollback" and was_production(before):
        previous = after.get("previous_production_pointer")
        if previous:
            return {PRODUCTION_POINTER_KEY: _json_bytes(previous)}, []
        return {}, [PRODUCTION_POINTER_KEY]
    return {}, []


def _cohort_table(decision: Decision) -> pd.DataFrame:
    rows = []
    for name, metrics in (("candidate", decision.candidate), ("control", decision.control)):
        if metrics is not None:
            values = metrics.as_dict()
            values.pop("confidence_histogram")
            rows.append({"cohort": name, **values})
    return pd.DataFrame(rows)


def _decide(
    lake: VersionedLake,
    state: dict[str, Any],
    settings: RolloutSettings,
    config: RolloutConfig,
    telemetry_commit: str | None,
    at: str,
    run_id: str,
) -> tuple[dict[str, Any], Decision, dict[str, Any] | None]:
    """The state machine step this materialization asks for (certificate already verified),
    plus the older rollout's new state when this step supersedes it."""
    if config.approved_by:
        new, decision = approve_next_stage(
            state,
            settings,
            approver=config.approved_by,
            telemetry_commit=telemetry_commit,
            at=at,
            run_id=run_id,
        )
        return new, decision, None
    if state["status"] == SHADOW:
        return _start(lake, state, settings, telemetry_commit, at, run_id)
    records = telemetry_since(lake, state.get("stage_started_telemetry_commit"))
    new, decision = evaluate_stage(
        state,
        settings,
        telemetry_commit=telemetry_commit,
        records=records,
        at=at,
        run_id=run_id,
    )
    return new, decision, None


def _start(
    lake: VersionedLake,
    state: dict[str, Any],
    settings: RolloutSettings,
    telemetry_commit: str | None,
    at: str,
    run_id: str,
) -> tuple[dict[str, Any], Decision, dict[str, Any] | None]:
    """Leave shadow; if the candidate takes over an active rollout, that rollout's state too."""
    pointer = (
        lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
        if lake.object_exists(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
        else None
    )
    active = active_rollout(list_states(lake))
    new, decision = start_rollout(
        state,
        settings,
        telemetry_commit=telemetry_commit,
        production=pointer,
        production_engine_sha256=load_deployed_engine(lake).engine.sha256,
        active_rollout=active,
        gated_against=gated_against(lake, state["model_version"]),
        at=at,
        run_id=run_id,
    )
    superseded = None
    if decision.changed_state and new.get("supersedes"):
        older = read_state(lake, str(new["supersedes"]))
        superseded = supersede_rollout(older, by_version=new["model_version"], at=at, run_id=run_id)
    return new, decision, superseded


@dg.asset(
    group_name=GROUP,
    kinds={"lakefs", "mlflow"},
    deps=[shadow_report, dg.AssetKey("fleet_telemetry")],
)
def rollout(
    context: dg.AssetExecutionContext,
    config: RolloutConfig,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    release_keys: ReleaseKeys,
) -> dg.MaterializeResult:
    """One step of the staged rollout: start after shadow, judge the stage on fresh telemetry
    (advance, wait, await approval, or roll back on a breach), or apply an operator's approval
    or rollback. Re-running on telemetry already decided on changes nothing."""
    settings = RolloutSettings.from_gates()
    model_version = _target_version(lake, config.model_version)
    state = read_state(lake, model_version)
    if state is None:
        raise dg.Failure(
            description=f"model version {model_version} has no rollout state: materialize "
            "shadow_report for it first",
            allow_retries=False,
        )
    registry = ModelRegistry(mlflow_tracking.uri())
    at, run_id = _now(), context.run.run_id
    telemetry_commit = latest_telemetry_commit(lake)
    superseded = None
    if config.rollback_reason:
        new, decision = roll_back(state, reason=config.rollback_reason, at=at, run_id=run_id)
    else:
        try:
            verify_certificate(lake, model_version, release_keys.certificate_public_key())
        except CertificateError as error:
            if state["status"] not in ACTIVE_STATUSES:
                raise
            # An engine on cars whose certificate no longer holds is pulled, not kept.
            new, decision = roll_back(
                state, reason=f"certificate no longer verifies: {error}", at=at, run_id=run_id
            )
        else:
            new, decision, superseded = _decide(
                lake, state, settings, config, telemetry_commit, at, run_id
            )
    commit = lake.resolve_ref(MAIN_BRANCH)
    if decision.changed_state:
        puts, deletes = _pointer_changes(lake, state, new, decision)
        puts[rollout_state_key(model_version)] = _json_bytes(new)
        if superseded is not None:
            puts[rollout_state_key(superseded["model_version"])] = _json_bytes(superseded)
        if new["status"] != SHADOW:
            puts[CURRENT_ROLLOUT_KEY] = _json_bytes({"model_version": model_version})
        commit = publish_changes(
            lake,
            root_run_id_of(context.run),
            puts,
            deletes,
            f"rollout {model_version}: {decision.action} ({new['status']}, {new['stage']})",
            {
                "kind": "rollout",
                "model_version": model_version,
                "action": decision.action,
                "status": new["status"],
                "stage": new["stage"],
                "telemetry_commit": decision.telemetry_commit or "",
                "dagster_run_id": run_id,
            },
        )
    registry_tags = reconcile_registry(registry, new)
    if superseded is not None:
        reconcile_registry(registry, superseded)
    if decision.action == "rollback":
        context.log.warning(f"rolled back model version {model_version}: {decision.reason}")
    breaches = pd.DataFrame([b.as_dict() for b in decision.breaches])
    return dg.MaterializeResult(
        metadata={
            "model_version": model_version,
            "action": decision.action,
            "reason": decision.reason,
            "status": new["status"],
            "stage": new["stage"],
            "cohort_percent": float(new["cohort_percent"]),
            "telemetry_commit": decision.telemetry_commit or "",
            "cohorts": _md(_cohort_table(decision).round(4)),
            "breaches": _md(breaches),
            "approval": dg.MetadataValue.json(new.get("approval")),
            "previous_production": str(new.get("previous_production")),
            "superseded": str(superseded["model_version"]) if superseded else "",
            "registry_tags": dg.MetadataValue.json(registry_tags),
            "main_commit": commit,
        }
    )
