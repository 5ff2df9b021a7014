"""What one cycle of the loop did, printed from ``main`` and the run history.

Every number comes from where an operator would look it up — lake objects on ``main`` (reports,
certificate, rollout state, OTA metadata) and Dagster's materializations — so the summary is
also a check that each stage published what it claims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aiinfra_pipelines.curation.trigger_proposals import (
    driven_hours_by_branch,
    slice_yield_by_version,
)
from aiinfra_pipelines.fleet.settings import frame_rate_hz
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions, read_parquet_prefix
from aiinfra_pipelines.lake.layout import (
    MAIN_BRANCH,
    PUBLISHED_TELEMETRY_PREFIX,
    candidate_certificate_key,
    candidate_report_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.rollout_store import list_states
from aiinfra_pipelines.release.shadow import shadow_agreement
from aiinfra_pipelines.release.trigger_ota import approved_trigger_config, read_proposal
from aiinfra_pipelines.sensors.retrain_sensor import plan_retraining
from aiinfra_pipelines.status import frames_by_slice

from .fleet_cycle import FleetUpload

REPORT_GATES = ("offline_eval", "engine_parity", "engine_benchmark", "regression_simulation")


@dataclass
class CycleWindow:
    """Runs of one cycle: created after ``started`` (a Unix timestamp)."""

    started: float

    def runs(self, instance: dg.DagsterInstance, job: str | None = None) -> list[dg.DagsterRun]:
        filters = dg.RunsFilter(created_after=_utc(self.started), job_name=job)
        return list(instance.get_runs(filters=filters))


def _utc(timestamp: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC)


def materialization_metadata(
    instance: dg.DagsterInstance, run: dg.DagsterRun, asset: str
) -> dict[str, Any]:
    records = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    for record in records:
        materialization = record.event_log_entry.asset_materialization
        if materialization and materialization.asset_key == dg.AssetKey(asset):
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return {}


def print_data_summary(
    lake: VersionedLake, upload: FleetUpload, runs: list[dg.DagsterRun], console: Console
) -> None:
    branch = upload.logs.branch
    index = scene_index_view(lake)
    index = index[index["source_branch"] == branch] if not index.empty else index
    quarantine = quarantine_view(lake)
    quarantine = (
        quarantine[quarantine["source_branch"] == branch] if not quarantine.empty else quarantine
    )
    failed = [run for run in runs if run.status != dg.DagsterRunStatus.SUCCESS]
    accepted = index["log_key"].nunique() if not index.empty else 0
    console.print(
        f"[bold]logs[/] landed {len(upload.logs.keys)}, accepted {accepted}, "
        f"quarantined {len(quarantine)}, "
        f"failed runs {len(failed)}; telemetry {upload.telemetry.records} drive record(s), "
        f"{upload.candidate_drives} from the candidate cohort"
    )
    table = Table("slice", "logs", "frames", title="frames indexed by slice (on main)")
    for row in frames_by_slice(index).itertuples():
        table.add_row(row.slice, str(row.logs), str(row.frames))
    console.print(table)
    for row in quarantine.itertuples():
        console.print(f"[yellow]quarantined[/] {row.log_key}: {row.reason_codes}")


def print_fleet_shadow(lake: VersionedLake, upload: FleetUpload, console: Console) -> None:
    """What the cars outside the cohort saw running the candidate in shadow mode."""
    records = read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    if records.empty:
        return
    batch = records[records["batch_id"] == upload.telemetry.branch]
    for sha, entry in shadow_agreement(batch).items():
        console.print(
            f"[bold]shadow mode[/] on {entry['vehicles']} car(s): engine {sha[:12]} planned like "
            f"the driven stack on {entry['decision_agreement']:.1%} of {entry['frames']} frames"
        )


def print_mining_summary(lake: VersionedLake, partitions: list[str], console: Console) -> None:
    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    labels = read_asset_partitions(lake, "auto_labels", MAIN_BRANCH)
    reasons = (
        badcases["reasons"].str.split(",").explode().value_counts().to_dict()
        if not badcases.empty
        else {}
    )
    held_back = int(labels["held_back"].sum()) if len(labels) else 0
    console.print(
        f"[bold]mining[/] {len(partitions)} new batch(es); on main {len(badcases)} badcase "
        f"frame(s) by reason {reasons}; label QC holds back {held_back}"
    )


def candidate_report(lake: VersionedLake, version: str, gate: str) -> dict | None:
    """One gate's report of a candidate on ``main`` (None until published)."""
    return lake.get_json_or_none(MAIN_BRANCH, candidate_report_key(version, gate))


def print_training_summary(
    instance: dg.DagsterInstance, lake: VersionedLake, window: CycleWindow, console: Console
) -> str | None:
    """The cycle's training run, its candidate's gates; returns the model version (if any)."""
    runs = window.runs(instance, "training_cycle")
    if not runs:
        why = plan_retraining(lake).reason
        console.print(f"[bold]training[/] not triggered this cycle: {escape(why)}")
        return None
    run = runs[0]
    dataset = materialization_metadata(instance, run, "training_dataset")
    model = materialization_metadata(instance, run, "trained_model")
    evaluation = materialization_metadata(instance, run, "offline_eval")
    version = str(model.get("model_version")) if model.get("model_version") else None
    console.print(
        f"[bold]training cycle[/] {run.status.value}: dataset {dataset.get('dataset_version')} at "
        f"commit {str(dataset.get('dataset_commit', ''))[:12]} ({dataset.get('frames')} frames, "
        f"{dataset.get('badcases')} badcases) → model version {version} "
        f"(MLflow run {str(model.get('mlflow_run_id', ''))[:12]}, {model.get('epochs')} epochs)"
    )
    if "comparison" in evaluation:
        console.print("per-slice offline metrics, candidate vs production:")
        console.print(escape(str(evaluation["comparison"])))
    console.print(f"offline gate passed: {evaluation.get('passed')}")
    if version is None:
        return None
    parity = candidate_report(lake, version, "engine_parity")
    if parity:
        for engine, entry in sorted((parity.get("engines") or {}).items()):
            worst = entry.get("worst") if isinstance(entry, dict) else None
            shown = (
                f"worst gated slice {worst['slice']} {worst['metric']} drop {worst['drop']:+.4f} "
                f"(budget {worst['budget']})"
                if worst
                else "no gated slice"
            )
            console.print(f"[bold]engine parity[/] {engine} vs fp32: {shown}")
    benchmark = candidate_report(lake, version, "engine_benchmark")
    if benchmark:
        for precision, stats in sorted((benchmark.get("engines") or {}).items()):
            console.print(
                f"[bold]engine benchmark[/] {precision}: p50 {stats.get('p50_ms', 0):.3f} ms, "
                f"p99 {stats.get('p99_ms', 0):.3f} ms, "
                f"{stats.get('throughput_fps', 0):.0f} frames/s"
            )
    if parity is None or benchmark is None:
        console.print(f"engines of model version {version} were not published (a gate failed)")
    return version


def print_release_summary(
    instance: dg.DagsterInstance,
    lake: VersionedLake,
    window: CycleWindow,
    version: str | None,
    console: Console,
) -> None:
    if version is not None:
        simulation = candidate_report(lake, version, "regression_simulation")
        if simulation:
            figures = simulation.get("summary", {})
            console.print(
                f"[bold]regression simulation[/] model version {version}: "
                f"{'passed' if simulation['passed'] else 'refused'}; at-fault collisions over "
                f"{figures.get('scenarios')} scenarios × the first "
                f"{figures.get('seeds_per_scenario')} seeds: candidate "
                f"{figures.get('candidate_at_fault')}, production "
                f"{figures.get('production_at_fault')}, oracle {figures.get('oracle_at_fault')}, "
                f"model zero {figures.get('model_zero_at_fault')}"
            )
            aggregate = simulation.get("aggregate") or {}
            console.print(
                f"  {aggregate.get('confirmed_scenarios')} scenario(s) in doubt ran more seeds "
                f"(mean {aggregate.get('mean_seeds')} per scenario); rules gates.yaml "
                f"{simulation.get('gates_version')} {str(simulation.get('gates_sha256'))[:12]}"
            )
            for failure in simulation.get("failures", [])[:5]:
                console.print(f"  [yellow]{escape(str(failure))}[/]")
        certified = lake.object_exists(MAIN_BRANCH, candidate_certificate_key(version))
        console.print(
            f"[bold]certification[/] model version {version}: "
            + ("certified (signed certificate on main)" if certified else "not certified")
        )
        for run in window.runs(instance, "regression_report_run"):
            if run.status == dg.DagsterRunStatus.FAILURE:
                console.print(f"  [yellow]report/certification run {run.run_id[:8]} failed[/]")
    states = Table(
        "model version", "status", "stage", "cohort %", "last decision", title="rollouts"
    )
    for state in list_states(lake):
        last = state.last_event
        states.add_row(
            state.model_version,
            state.status,
            state.stage,
            str(state.cohort_percent),
            escape(f"{last.get('event', '')}: {last.get('reason', '')}"[:70]),
        )
    console.print(states)
    ota_runs = [
        run
        for run in window.runs(instance)
        if materialization_metadata(instance, run, "ota_release")
    ]
    if ota_runs:
        ota = materialization_metadata(instance, ota_runs[0], "ota_release")
        console.print(
            f"[bold]OTA[/] TUF metadata versions {ota.get('versions')}, engines offered "
            f"{ota.get('engines')}"
        )
    failures = [run for run in window.runs(instance) if run.status == dg.DagsterRunStatus.FAILURE]
    if failures:
        console.print(
            f"[yellow]{len(failures)} run(s) failed this cycle (see loop_failures in the UI):[/] "
            + ", ".join(f"{run.job_name} {run.run_id[:8]}" for run in failures[:6])
        )


def trigger_yield(lake: VersionedLake) -> dict[str, Any]:
    """For every slice the shipped config targeted: its yield under the base and the shipped
    version, from the scene index (index-only rows included) and telemetry's driven hours."""
    approved = approved_trigger_config(lake)
    if approved is None:
        return {}
    proposal = read_proposal(lake, approved.version) or {}
    index = scene_index_view(lake, include_index_only=True)
    telemetry = read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    hours = driven_hours_by_branch(telemetry, frame_rate_hz())
    versions = {approved.base_version, approved.version}
    by_slice = {}
    for rule in proposal.get("rules", []):
        table = slice_yield_by_version(index, str(rule["slice"]), hours)
        table = table[table["trigger_config_version"].isin(versions)]
        by_slice[str(rule["slice"])] = table.to_dict(orient="records")
    return {"base_version": approved.base_version, "version": approved.version, "slices": by_slice}


def print_trigger_yield(figures: dict[str, Any], console: Console) -> None:
    """The targeted slices' yield, old vs new trigger config version."""
    for slice_name, rows in (figures.get("slices") or {}).items():
        table = Table(
            "trigger config",
            "frames kept",
            "slice frames",
            "slice share",
            "driven h",
            "slice frames/h",
            title=f"yield of {slice_name}: {figures['base_version']} → {figures['version']}",
        )
        for row in rows:
            per_hour = row["slice_frames_per_hour"]
            table.add_row(
                str(row["trigger_config_version"]),
                str(row["frames"]),
                str(row["slice_frames"]),
                f"{row['share']:.1%}",
                f"{row['driven_hours']:.2f}",
                "" if per_hour is None or per_hour != per_hour else f"{per_hour:.0f}",
            )
        console.print(table)
