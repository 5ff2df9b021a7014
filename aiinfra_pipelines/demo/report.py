"""``dagster_home/demo/summary.json``: what each cycle of the demo achieved, as numbers.

The printed summary is for a person; this file is for comparing runs (another seed, another
fleet size, another recipe). Each figure is read where an operator would find it — the lake on
``main`` (scene index, quarantine, candidate reports, certificate, rollout state) and Dagster's
run history (the training run's offline evaluation, step times for the cost ledger) — never
from what the demo believes it asked for.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.ingest.pulls import pull_request_counts
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, candidate_certificate_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import read_ref
from aiinfra_pipelines.operations.cost_ledger import (
    LedgerSettings,
    ledger_by_group,
    loop_asset_groups,
    run_step_costs,
)
from aiinfra_pipelines.operations.storage_use import storage_use
from aiinfra_pipelines.release.rollout_state import RolloutState
from aiinfra_pipelines.release.rollout_store import read_state

from .fleet_cycle import FleetUpload
from .summary import CycleWindow, candidate_report

OFFLINE_EVAL = dg.AssetKey("offline_eval")
CERTIFIED_ENGINE = dg.AssetKey("certified_engine")


@dataclass
class DemoSummary:
    """The file's content, kept up to date cycle by cycle (a killed demo keeps what it did)."""

    path: Path
    cycles: list[dict[str, Any]] = field(default_factory=list)
    # The effective gate configuration every verdict of this demo was judged under.
    gates_sha256: str | None = None

    def add(self, cycle: dict[str, Any], total_s: float) -> None:
        self.cycles.append(cycle)
        self.write(total_s)

    def write(self, total_s: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "total_s": round(total_s, 1),
            "cycles": self.cycles,
            "gates_sha256": self.gates_sha256,
        }
        self.path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return round(number, 4) if math.isfinite(number) else None


def _offline_eval(lake: VersionedLake, run: dg.DagsterRun | None) -> dict[str, Any] | None:
    """The training run's ``offline_eval`` value: on ``main`` once published, else its branch."""
    if run is None:
        return None
    key = asset_object_base(OFFLINE_EVAL, None) + ".json"
    ref = read_ref(lake, run.root_run_id or run.run_id)
    value = lake.get_json_or_none(ref, key)
    return value if value and value.get("mlflow_run_id") else None


def benchmark_figures(evaluation: dict[str, Any] | None) -> dict[str, Any]:
    """Overall scores, the worst gated slice and the no-camera baseline of one candidate."""
    if not evaluation:
        return {}
    rows = evaluation.get("candidate") or []
    overall = next((r for r in rows if r.get("slice") == "overall"), {})
    min_frames = settings_section("gates.yaml", "offline").int("min_slice_frames")
    gated = [
        r
        for r in rows
        if r.get("slice") != "overall"
        and int(r.get("frames") or 0) >= min_frames
        and _finite(r.get("occupancy_accuracy")) is not None
    ]
    worst = min(gated, key=lambda r: float(r["occupancy_accuracy"]), default=None)
    baseline = next(
        (r for r in evaluation.get("baseline") or [] if r.get("slice") == "overall"), {}
    )
    return {
        "accuracy": _finite(overall.get("occupancy_accuracy")),
        "f1": _finite(overall.get("occupancy_f1")),
        "lead_gap_mae_m": _finite(overall.get("lead_gap_mae_m")),
        "worst_slice": worst["slice"] if worst else None,
        "worst_slice_accuracy": _finite(worst["occupancy_accuracy"]) if worst else None,
        "baseline_accuracy": _finite(baseline.get("occupancy_accuracy")),
        "baseline_lead_gap_mae_m": _finite(baseline.get("lead_gap_mae_m")),
        "frames": int(overall.get("frames") or 0),
        "slices": {
            str(r["slice"]): _finite(r.get("occupancy_accuracy"))
            for r in rows
            if r.get("slice") != "overall"
        },
    }


def simulation_figures(lake: VersionedLake, version: str | None) -> dict[str, Any]:
    report = candidate_report(lake, version, "regression_simulation") if version else None
    if not report:
        return {}
    summary = report.get("summary") or {}
    aggregate = report.get("aggregate") or {}
    return {
        "passed": bool(report.get("passed")),
        "failures": report.get("failures") or [],
        "gates_sha256": report.get("gates_sha256"),
        "confirmed_scenarios": aggregate.get("confirmed_scenarios"),
        "mean_seeds": aggregate.get("mean_seeds"),
        "candidate_episodes_all_stages": aggregate.get("candidate_episodes_all_stages"),
        "candidate_at_fault": summary.get("candidate_at_fault"),
        "production_at_fault": summary.get("production_at_fault"),
        "oracle_at_fault": summary.get("oracle_at_fault"),
        "model_zero_at_fault": summary.get("model_zero_at_fault"),
        "scenarios": summary.get("scenarios"),
        "episodes": summary.get("episodes"),
        "seeds_per_scenario": summary.get("seeds_per_scenario"),
    }


def _certified_at(instance: dg.DagsterInstance, window: CycleWindow) -> float | None:
    """When this cycle's engine was certified: the certification step's materialization."""
    records = instance.fetch_materializations(CERTIFIED_ENGINE, limit=5).records
    times = [r.timestamp for r in records if r.timestamp >= window.started]
    return min(times) if times else None


def compute_seconds_by_stage(instance: dg.DagsterInstance, window: CycleWindow) -> dict[str, float]:
    """CPU + GPU step seconds per asset group over the cycle's finished runs (cost ledger)."""
    settings = LedgerSettings.load()
    groups = loop_asset_groups()
    rows = [
        row
        for run in window.runs(instance)
        if run.is_finished
        for row in run_step_costs(instance, run, groups, settings)
    ]
    table = ledger_by_group(pd.DataFrame(rows))
    return {
        str(r.group): round(float(r.cpu_seconds) + float(r.gpu_seconds), 1)
        for r in table.itertuples()
    }


def release_stages(lake: VersionedLake, newest: str | None) -> dict[str, dict[str, Any]]:
    """``{version: {stage, status, events}}`` for every model version up to ``newest``."""
    if not newest or not str(newest).isdigit():
        return {}
    stages = {}
    for version in range(1, int(newest) + 1):
        state = read_state(lake, str(version))
        if state:
            stages[str(version)] = {
                "stage": state.stage,
                "status": state.status,
                "events": [entry.get("event") for entry in state.history],
            }
    return stages


def cycle_record(
    instance: dg.DagsterInstance,
    lake: VersionedLake,
    *,
    cycle: int,
    upload: FleetUpload,
    window: CycleWindow,
    landed_at: float,
    version: str | None,
    cycle_s: float,
) -> dict[str, Any]:
    """One entry of ``cycles`` in summary.json."""
    branch = upload.logs.branch
    index = scene_index_view(lake)
    accepted = int((index["source_branch"] == branch).sum()) if not index.empty else 0
    quarantine = quarantine_view(lake)
    quarantined = int((quarantine["source_branch"] == branch).sum()) if not quarantine.empty else 0
    training = window.runs(instance, "training_cycle")
    certified = bool(version) and lake.object_exists(
        MAIN_BRANCH, candidate_certificate_key(version)
    )
    rollout = read_state(lake, version) if version else None
    certified_at = _certified_at(instance, window) if certified else None
    return {
        "cycle": cycle,
        "frames_landed": upload.frames,
        "frames_accepted": accepted,
        "logs_landed": len(upload.logs.keys),
        "logs_quarantined": quarantined,
        "model_version": version,
        "benchmark": benchmark_figures(_offline_eval(lake, training[0] if training else None)),
        "simulation": simulation_figures(lake, version),
        "certified": certified,
        "rollout": rollout_view(rollout),
        # Every release's rollout as this cycle left it: an earlier cycle's candidate moves on
        # (past its canary) on the telemetry this cycle's fleet drove.
        "rollouts": release_stages(lake, version),
        "kpis": {
            "frames_published_share": round(accepted / upload.frames, 4) if upload.frames else 0,
            "landing_to_certified_s": (
                round(certified_at - landed_at, 1) if certified_at is not None else None
            ),
            "compute_s_by_stage": compute_seconds_by_stage(instance, window),
        },
        "uploads": upload_figures(upload),
        "pull_requests": pull_request_figures(lake),
        # The seed's "how much of what we store is ever used in training", after this cycle.
        "storage": storage_use(lake),
        "cycle_s": round(cycle_s, 1),
    }


def rollout_view(state: RolloutState | None) -> dict[str, Any]:
    """A rollout's stage and status, and its last decision with the exposure it rested on and
    the exposure its sequential tests still need (``None`` where nothing was judged yet)."""
    last = state.last_decision() if state else None
    return {
        "stage": state.stage if state else None,
        "status": state.status if state else None,
        "decision": None if last is None else last.get("action"),
        "exposure_frames": None if last is None else last.get("exposure_frames"),
        "exposure_needed_frames": None if last is None else last.get("exposure_needed_frames"),
    }


def upload_figures(upload: FleetUpload) -> dict[str, Any]:
    """What the cars' outboxes did in this cycle's upload, and what they hold after it."""
    sent = upload.outboxes
    if sent is None:
        return {}
    cars = sent.cars.values()
    return {
        "raw_logs": sent.raw_logs,
        "index_only_segments": sent.index_only,
        "pulls_served": sent.pulls_served,
        "pulls_unservable": sent.pulls_unservable,
        "evictions": sent.evictions,
        "bytes_sent_by_class": dict(sent.bytes_sent_by_class),
        # After the upload: raw logs still queued (budget, window) and logs held index-only.
        "backlog_logs": sum(entry["logs"] for car in cars for entry in car["backlog"].values()),
        "held_logs": sum(car["held"]["logs"] for car in cars),
    }


def pull_request_figures(lake: VersionedLake) -> dict[str, int]:
    """Pull requests on main by status (open, served, closed)."""
    return pull_request_counts(lake)
