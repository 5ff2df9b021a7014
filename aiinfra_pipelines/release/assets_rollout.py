"""``shadow_report`` and ``rollout`` (group ``release``): Dagster wiring over plain steps.

The work lives in ``shadow_run.py`` (compare, fold the verdict into the rollout state,
publish) and ``rollout_step.py`` (pick, decide, publish, reconcile the registry); these assets
only resolve resources, call those steps, turn their refusals into non-retried failures and
build the materialization metadata (the ``*_metadata`` helpers below).

Both verify the candidate's certificate (signature and every hash it binds) before they act,
with two exceptions in ``rollout``: an operator's rollback skips the check, because pulling an
engine must never be blocked by a broken certificate, and an *active* rollout whose
certificate no longer verifies is rolled back instead of refused. Every state change reaches
``main`` in one published act (state, pointer, ``current.json`` together), and the MLflow
registry is then reconciled with the state on every run, changed or not, so a registry hiccup
heals on the next materialization instead of leaving the two disagreeing.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of
from aiinfra_pipelines.metadata_tables import markdown_table, table_metadata
from aiinfra_pipelines.training.resources import MlflowTracking

from .assets_certification import certified_engine
from .certificate import latest_candidate, verify_certificate
from .keys import ReleaseKeys
from .registry import ModelRegistry
from .release_state import RELEASE_STATE_COLUMNS, production_line, rollout_rows
from .rollout_decision import Decision
from .rollout_settings import RolloutSettings
from .rollout_state import ROLLED_BACK
from .rollout_step import (
    RolloutRefused,
    RolloutRequest,
    RolloutStep,
    decide_step,
    load_target,
    publish_step,
    reconcile_registry,
)
from .rollout_store import list_states
from .shadow import shadow_report_key
from .shadow_run import (
    ShadowComparison,
    ShadowRefused,
    compare_on_recent_logs,
    publish_shadow,
    shadow_registry_tags,
    shadow_report_document,
    shadow_state_change,
)

GROUP = "release"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _md(table: pd.DataFrame) -> dg.MetadataValue:
    return dg.MetadataValue.md(markdown_table(table) if len(table) else "none")


def _refused(error: Exception) -> dg.Failure:
    """A step that cannot run as asked: fail once, with the step's reason, no retries."""
    return dg.Failure(description=str(error), allow_retries=False)


class ShadowConfig(dg.Config):
    """Which certified candidate to shadow; empty = the newest published candidate."""

    model_version: str = ""


def shadow_metadata(
    shadow: ShadowComparison, state_note: str, commit: str, repository: str
) -> dict[str, Any]:
    """The ``shadow_report`` materialization: verdict, per-slice table, where it was stored."""
    summary = shadow.summary
    return {
        "model_version": shadow.model_version,
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
        "fleet_shadow": dg.MetadataValue.json(shadow.fleet_shadow or {}),
        "per_slice": _md(shadow.per_slice.round(4)),
        "badcases": len(shadow.badcases),
        "production": shadow.production.version,
        "state": state_note,
        "main_commit": commit,
        "report": f"lakefs://{repository}/{commit}/{shadow_report_key(shadow.model_version)}",
    }


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
    registry = ModelRegistry(mlflow_tracking.uri())
    registry.version(model_version)  # unregistered → a clear error before anything is written
    run_id = context.run.run_id
    try:
        shadow = compare_on_recent_logs(lake, model_version, certificate)
    except ShadowRefused as error:
        raise _refused(error) from error
    report_bytes = json_document(shadow_report_document(lake, shadow, run_id))
    state, state_note = shadow_state_change(lake, shadow, _now(), run_id)
    commit = publish_shadow(lake, shadow, report_bytes, state, root_run_id_of(context.run), run_id)
    registry.set_tags(model_version, shadow_registry_tags(shadow, report_bytes))
    return dg.MaterializeResult(
        metadata=shadow_metadata(shadow, state_note, commit, lake.repository)
    )


class RolloutConfig(dg.Config):
    """One rollout step. Empty ``model_version``: the current rollout, else the newest
    candidate still in shadow. ``approved_by``: the approver's name, to enter a stage that
    waits for approval (the full fleet always does). ``rollback_reason``: roll back now."""

    model_version: str = ""
    approved_by: str = ""
    rollback_reason: str = ""


def cohort_table(decision: Decision) -> pd.DataFrame:
    """Candidate and control cohort metrics side by side (histograms left out)."""
    rows = []
    for name, metrics in (("candidate", decision.candidate), ("control", decision.control)):
        if metrics is not None:
            values = metrics.as_dict()
            values.pop("confidence_histogram")
            rows.append({"cohort": name, **values})
    return pd.DataFrame(rows)


def tests_table(decision: Decision) -> pd.DataFrame:
    """One row per metric of the stage's sequential tests: counts or means, the estimate with
    its bounds, the outcome, and the exposure still needed (events)."""
    judgement = decision.judgement
    if judgement is None:
        return pd.DataFrame()
    rows = []
    for name, verdict in judgement.events.items():
        low, high = verdict.ratio_interval
        rows.append(
            {
                "metric": name,
                "outcome": verdict.outcome,
                "candidate": f"{verdict.candidate_events:g} / {verdict.candidate_exposure:g} fr",
                "control": f"{verdict.control_events:g} / {verdict.control_exposure:g} fr",
                "estimate": "n/a" if verdict.rate_ratio is None else f"{verdict.rate_ratio:.2f}x",
                "ci95": f"{low:.2f}-{'inf' if high is None else f'{high:.2f}'}",
                "e_harm": round(verdict.harm_e_value, 3),
                "e_non_inferior": round(verdict.noninferiority_e_value, 3),
                "frames_needed": ""
                if verdict.exposure_needed is None
                else round(verdict.exposure_needed),
            }
        )
    for verdict in judgement.budgets.values():
        rows.append(
            {
                "metric": verdict.metric,
                "outcome": verdict.outcome,
                "candidate": "" if verdict.candidate is None else f"{verdict.candidate:.4g}",
                "control": "" if verdict.control is None else f"{verdict.control:.4g}",
                "estimate": "" if verdict.worsening is None else f"{verdict.worsening:+.4g}",
                "ci95": ""
                if verdict.lower is None
                else f"{verdict.lower:.4g}..{verdict.upper:.4g} (budget {verdict.budget:g})",
                "e_harm": "",
                "e_non_inferior": "",
                "frames_needed": "",
            }
        )
    return pd.DataFrame(rows)


def rollout_metadata(
    step: RolloutStep,
    registry_tags: dict[str, str],
    commit: str,
    release_state: tuple[str, list[dict[str, str]]] = ("", []),
) -> dict[str, Any]:
    """The ``rollout`` materialization: the decision, its evidence, and where things stand
    (``release_state``: the production line and every rollout's row, as ``aiinfra status``)."""
    new, decision = step.after, step.decision
    production, rows = release_state
    breaches = pd.DataFrame([b.as_dict() for b in decision.breaches])
    return {
        "model_version": step.model_version,
        "action": decision.action,
        "reason": decision.reason,
        "status": new.status,
        "stage": new.stage,
        "cohort_percent": float(new.cohort_percent),
        "telemetry_commit": decision.telemetry_commit or "",
        "cohorts": _md(cohort_table(decision).round(4)),
        "breaches": _md(breaches),
        # The stage's sequential tests, and its exposure as numbers the UI plots over time.
        "tests": _md(tests_table(decision)),
        "exposure_frames": int(decision.candidate.frames if decision.candidate else 0),
        "exposure_needed_frames": int(
            (decision.judgement.exposure_needed_frames or 0) if decision.judgement else 0
        ),
        "approval": dg.MetadataValue.json(new.approval.to_json() if new.approval else None),
        "previous_production": str(new.previous_production),
        "superseded": step.superseded.model_version if step.superseded else "",
        "registry_tags": dg.MetadataValue.json(registry_tags),
        "main_commit": commit,
        # Where the whole release stands, kept current by every rollout step.
        "production": production,
        "release_state": table_metadata(rows, columns=RELEASE_STATE_COLUMNS),
    }


ROLLOUT_HEALTH_CHECK = "release_not_rolled_back"


def rollout_health(step: RolloutStep) -> dg.AssetCheckResult:
    """A rolled-back release is a failure where operators look for failures (a red check on the
    asset), not a green materialization whose metadata happens to say ``rolled_back``."""
    new = step.after
    rolled_back = new.status == ROLLED_BACK
    return dg.AssetCheckResult(
        check_name=ROLLOUT_HEALTH_CHECK,
        passed=not rolled_back,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "model_version": step.model_version,
            "status": new.status,
            "reason": str(new.last_event.get("reason", "")) if rolled_back else "",
        },
    )


@dg.asset(
    group_name=GROUP,
    kinds={"lakefs", "mlflow"},
    deps=[shadow_report, dg.AssetKey("fleet_telemetry")],
    check_specs=[
        dg.AssetCheckSpec(
            ROLLOUT_HEALTH_CHECK,
            asset="rollout",
            description="The release this step acted on is not rolled back (rollbacks are red).",
        )
    ],
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
    settings = RolloutSettings.load()
    request = RolloutRequest(config.model_version, config.approved_by, config.rollback_reason)
    try:
        state = load_target(lake, request.model_version)
    except RolloutRefused as error:
        raise _refused(error) from error
    registry = ModelRegistry(mlflow_tracking.uri())
    run_id = context.run.run_id
    step = decide_step(
        lake,
        state,
        settings,
        request,
        release_keys.certificate_public_key,
        at=_now(),
        run_id=run_id,
    )
    commit = lake.resolve_ref(MAIN_BRANCH)
    if step.decision.changed_state:
        commit = publish_step(lake, step, root_run_id_of(context.run), run_id)
    tags = reconcile_registry(registry, step.after)
    if step.superseded is not None:
        reconcile_registry(registry, step.superseded)
    if step.decision.action == "rollback":
        context.log.error(f"rolled back model version {step.model_version}: {step.decision.reason}")
    state = (production_line(lake, commit), rollout_rows(list_states(lake, commit)))
    return dg.MaterializeResult(
        metadata=rollout_metadata(step, tags, commit, state), check_results=[rollout_health(step)]
    )
