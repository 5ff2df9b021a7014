"""The work behind the ``shadow_report`` asset, as plain functions.

The asset only wires resources to these steps: compare the certified candidate with production
on recent fleet logs (:func:`compare_on_recent_logs`), fold the verdict into the candidate's
rollout state (:func:`shadow_state_change`), and publish report, badcases and state in one act
(:func:`publish_shadow`). Kept out of the asset body so each step can be read, tested and
reused (the demo, a CLI) without Dagster's context.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import parquet_bytes, read_parquet_prefix
from aiinfra_pipelines.lake.layout import (
    MAIN_BRANCH,
    PRODUCTION_POINTER_KEY,
    PUBLISHED_TELEMETRY_PREFIX,
    candidate_manifest_key,
    rollout_state_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_with_run_branch
from aiinfra_pipelines.mining.engine_runner import perceive_frames
from aiinfra_pipelines.mining.settings import EngineSettings
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import DeployedEngine, load_deployed_engine
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

from .rollout import new_rollout_state, refresh_shadow
from .rollout_state import SHADOW, RolloutState
from .rollout_store import read_state
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


class ShadowRefused(RuntimeError):
    """Shadow mode cannot run as asked (the message says why); not worth a retry."""


def engine_batch_size() -> int:
    return EngineSettings.load().batch_size


def candidate_engine(lake: VersionedLake, certificate: dict[str, Any]) -> OnnxRuntimeEngine:
    """The certified engine bytes (``verify_certificate`` already matched their hash)."""
    engine = certificate["engine"]
    return OnnxRuntimeEngine(
        lake.get_object(MAIN_BRANCH, engine["key"]),
        perception_spec(),
        name=str(certificate["model_version"]),
        batch_size=engine_batch_size(),
    )


def production_pointer_now(lake: VersionedLake) -> dict[str, Any] | None:
    """``release/production.json`` on main, or ``None`` before the first release."""
    return lake.get_json_or_none(MAIN_BRANCH, PRODUCTION_POINTER_KEY)


@dataclass(frozen=True)
class ShadowComparison:
    """One candidate beside production on the same recent frames, before anything is written."""

    model_version: str
    certificate: dict[str, Any]
    candidate: OnnxRuntimeEngine
    production: DeployedEngine
    rows: pd.DataFrame
    summary: dict[str, Any]
    per_slice: pd.DataFrame
    badcases: pd.DataFrame
    fleet_shadow: dict[str, Any] | None

    @property
    def passed(self) -> bool:
        return bool(self.summary["passed"])

    def state_record(self) -> dict[str, Any]:
        """The ``shadow`` section of the rollout state: the verdict, not the whole report."""
        return {
            "passed": self.summary["passed"],
            "reasons": self.summary["reasons"],
            "frames": self.summary["frames"],
            "decision_agreement": self.summary.get("decision_agreement"),
            "report_key": shadow_report_key(self.model_version),
        }


def compare_on_recent_logs(
    lake: VersionedLake, model_version: str, certificate: dict[str, Any]
) -> ShadowComparison:
    """Run both engines on recent fleet frames and judge the candidate against ``gates.yaml``.

    Also reads what cars that already ran this engine in shadow mode reported (vehicle-side
    telemetry), which is shown beside the offline verdict but does not decide it.
    """
    settings = ShadowSettings.load()
    candidate = candidate_engine(lake, certificate)
    production = load_deployed_engine(lake, batch_size=engine_batch_size())
    rows = recent_rows(
        scene_index_view(lake), settings.max_logs, settings.max_age_days, settings.max_frames
    )
    if rows.empty:
        raise ShadowRefused("no published fleet logs on main: shadow mode needs recent frames")
    frames = load_frames(lake, rows, MAIN_BRANCH)
    spec = perception_spec()
    comparison = compare_engines(
        frames,
        perceive_frames(production.engine, frames, spec),
        perceive_frames(candidate, frames, spec),
        settings,
    )
    fleet_shadow = shadow_agreement(
        read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    ).get(candidate.sha256)
    return ShadowComparison(
        model_version=model_version,
        certificate=certificate,
        candidate=candidate,
        production=production,
        rows=rows,
        summary=shadow_summary(comparison, settings),
        per_slice=per_slice_table(comparison),
        badcases=shadow_badcases(comparison, model_version, candidate.sha256),
        fleet_shadow=fleet_shadow,
    )


def shadow_report_document(
    lake: VersionedLake, shadow: ShadowComparison, run_id: str
) -> dict[str, Any]:
    """``candidates``-side record of the comparison: what was compared, on which logs."""
    return {
        "model_version": shadow.model_version,
        "passed": shadow.summary["passed"],
        "engine_sha256": shadow.candidate.sha256,
        "certificate_sha256": shadow.certificate["certificate_sha256"],
        "production_version": shadow.production.version,
        "production_engine_sha256": shadow.production.engine.sha256,
        "window": {
            "logs": sorted(shadow.rows["log_id"].unique().tolist()),
            "newest_recorded_at": str(shadow.rows["recorded_at"].max()),
            "main_commit": lake.resolve_ref(MAIN_BRANCH),
        },
        "summary": shadow.summary,
        "fleet_shadow": shadow.fleet_shadow,
        "per_slice": shadow.per_slice.to_dict(orient="records"),
        "badcases_key": shadow_badcases_key(shadow.model_version),
        "dagster_run_id": run_id,
    }


def shadow_state_change(
    lake: VersionedLake, shadow: ShadowComparison, at: str, run_id: str
) -> tuple[RolloutState, str]:
    """The candidate's rollout state after this verdict, and a note saying what changed.

    Created (status ``shadow``) the first time; refreshed while still in shadow; left alone
    once the rollout has started, since a later shadow run only re-reports.
    """
    state = read_state(lake, shadow.model_version)
    pointer = production_pointer_now(lake)
    production_sha256 = shadow.production.engine.sha256
    if state is None:
        manifest = lake.get_json(MAIN_BRANCH, candidate_manifest_key(shadow.model_version))
        created = new_rollout_state(
            shadow.model_version,
            shadow.candidate.sha256,
            engine_key=shadow.certificate["engine"]["key"],
            model_uri=str(manifest.get("model_uri") or ""),
            production=pointer,
            production_engine_sha256=production_sha256,
            shadow=shadow.state_record(),
            at=at,
            run_id=run_id,
        )
        return created, "rollout state created: shadow"
    if state.status == SHADOW:
        refreshed = refresh_shadow(
            state,
            shadow.state_record(),
            production=pointer,
            production_engine_sha256=production_sha256,
            at=at,
            run_id=run_id,
        )
        return refreshed, "shadow verdict refreshed"
    return state, f"state unchanged: rollout is {state.status}"


def publish_shadow(
    lake: VersionedLake,
    shadow: ShadowComparison,
    report_bytes: bytes,
    state: RolloutState,
    root_run_id: str,
    run_id: str,
) -> str:
    """Report, badcases and (while in shadow) the state reach ``main`` in one published act."""
    model_version = shadow.model_version
    objects = {
        shadow_report_key(model_version): report_bytes,
        shadow_badcases_key(model_version): parquet_bytes(shadow.badcases),
    }
    if state.status == SHADOW:
        objects[rollout_state_key(model_version)] = json_document(state.to_json())
    return publish_with_run_branch(
        lake,
        root_run_id,
        objects,
        f"shadow report for model version {model_version}: "
        f"{'passed' if shadow.passed else 'not passed'}",
        {"kind": "shadow", "model_version": model_version, "dagster_run_id": run_id},
    )


def shadow_registry_tags(shadow: ShadowComparison, report_bytes: bytes) -> dict[str, str]:
    """What the MLflow registry records of the verdict; the hash ties it to the stored report."""
    return {
        "shadow_passed": str(shadow.summary["passed"]).lower(),
        "shadow_decision_agreement": f"{shadow.summary.get('decision_agreement', 0.0):.4f}",
        "shadow_report_key": shadow_report_key(shadow.model_version),
        "shadow_report_sha256": hashlib.sha256(report_bytes).hexdigest(),
    }
