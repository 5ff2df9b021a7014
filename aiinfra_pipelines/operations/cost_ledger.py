"""What the loop costs: compute seconds per asset, partition and group, from Dagster's records.

The instance already knows every step's start and end (its event log) and, through each run's
execution-plan snapshot, which pool and tags the step ran with. One step attempt = from its
``STEP_START`` to the next terminal event (success, failure, up-for-retry), so retried steps
count every attempt. A step counts as GPU time when its pool (or an op tag) says so
(``operations.yaml`` ``cost_ledger``), otherwise CPU time. A step that materializes several
assets splits its time evenly between them; a failed step is charged to the assets it planned.

Seconds are wall-clock step time: what a per-step pod (k8s executor) is billed for, and on one
machine the time the step held its slot.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pandas as pd
from dagster import DagsterEventType

from aiinfra_pipelines.config import settings_section

LEDGER_PREFIX = "operations/cost_ledger/"
STEPS_KEY = f"{LEDGER_PREFIX}steps.parquet"
BY_GROUP_KEY = f"{LEDGER_PREFIX}by_group.json"
FINISHED = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
]
_TERMINAL = {
    DagsterEventType.STEP_SUCCESS.value: "success",
    DagsterEventType.STEP_FAILURE.value: "failure",
    DagsterEventType.STEP_UP_FOR_RETRY.value: "retried",
}
_EVENTS = {
    DagsterEventType.STEP_START,
    DagsterEventType.STEP_SUCCESS,
    DagsterEventType.STEP_FAILURE,
    DagsterEventType.STEP_UP_FOR_RETRY,
    DagsterEventType.ASSET_MATERIALIZATION,
}
# The layers whose assets the ledger names groups for (earlier layers than operations; a layer
# not built yet is skipped).
LAYERS = (
    "ingest",
    "mining",
    "datasets",
    "training",
    "evaluation",
    "deployment",
    "simulation",
    "release",
)
STEP_COLUMNS = (
    "run_id",
    "job_name",
    "step_key",
    "asset_key",
    "partition",
    "group",
    "status",
    "attempts",
    "compute",
    "seconds",
    "started_at",
)


@dataclass(frozen=True)
class LedgerSettings:
    gpu_pools: tuple[str, ...]
    gpu_step_tags: dict[str, str]
    max_runs: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> LedgerSettings:
        section = settings_section("operations.yaml", "cost_ledger", config)
        tags = section.section("gpu_step_tags", {}).values
        return cls(
            gpu_pools=tuple(str(p) for p in section.list("gpu_pools")),
            gpu_step_tags={str(k): str(v) for k, v in tags.items()},
            max_runs=section.int("max_runs"),
        )


def asset_groups(definitions: Iterable[dg.Definitions]) -> dict[str, str]:
    """``{asset key string: group}`` for every asset of the given definitions."""
    groups: dict[str, str] = {}
    for defs in definitions:
        for item in defs.assets or []:
            if isinstance(item, dg.AssetsDefinition):
                for key, group in item.group_names_by_key.items():
                    groups[key.to_user_string()] = group
            elif isinstance(item, dg.AssetSpec):
                groups[item.key.to_user_string()] = item.group_name or "default"
    return groups


def loop_asset_groups(extra: Iterable[dg.Definitions] = ()) -> dict[str, str]:
    """Groups of every asset of the loop's layers (those that exist), plus ``extra``."""
    definitions = []
    for layer in LAYERS:
        module_name = f"aiinfra_pipelines.{layer}.definitions"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue  # the layer (or its definitions) is not built yet
            raise
        definitions.append(module.defs)
    return asset_groups([*definitions, *extra])


def step_plan(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dict[str, dict[str, Any]]:
    """Per step key: its pool, tags and the asset keys it was planned to materialize."""
    if not run.execution_plan_snapshot_id:
        return {}
    snapshot = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    plan = {}
    for step in snapshot.steps:
        assets = [
            output.properties.asset_key.to_user_string()
            for output in step.outputs
            if output.properties is not None and output.properties.asset_key is not None
        ]
        plan[step.key] = {
            "pool": getattr(step, "pool", None),
            "tags": dict(step.tags or {}),
            "assets": assets,
        }
    return plan


def _is_gpu(plan: Mapping[str, Any], settings: LedgerSettings) -> bool:
    if plan.get("pool") in settings.gpu_pools:
        return True
    tags = plan.get("tags") or {}
    return any(tags.get(name) == value for name, value in settings.gpu_step_tags.items())


def run_step_costs(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    groups: Mapping[str, str],
    settings: LedgerSettings,
) -> list[dict[str, Any]]:
    """One row per (step, asset) of a finished run, with the step's seconds split evenly."""
    plan = step_plan(instance, run)
    started: dict[str, float] = {}
    seconds: dict[str, float] = defaultdict(float)
    attempts: dict[str, int] = defaultdict(int)
    status: dict[str, str] = {}
    first_start: dict[str, float] = {}
    materialized: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for record in instance.all_logs(run.run_id, of_type=_EVENTS):
        event = record.dagster_event
        step = event.step_key
        if step is None:
            continue
        kind = event.event_type_value
        if kind == DagsterEventType.STEP_START.value:
            started[step] = record.timestamp
            first_start.setdefault(step, record.timestamp)
            attempts[step] += 1
        elif kind == DagsterEventType.ASSET_MATERIALIZATION.value:
            materialization = event.step_materialization_data.materialization
            materialized[step].append(
                (materialization.asset_key.to_user_string(), materialization.partition or "")
            )
        elif kind in _TERMINAL and step in started:
            seconds[step] += max(0.0, record.timestamp - started.pop(step))
            status[step] = _TERMINAL[kind]
    run_partition = run.tags.get("dagster/partition", "")
    rows = []
    for step, total in seconds.items():
        planned = plan.get(step, {})
        targets = list(dict.fromkeys(materialized.get(step, [])))
        if not targets:
            targets = [(key, run_partition) for key in planned.get("assets", [])]
        if not targets:
            targets = [(step, run_partition)]
        compute = "gpu" if _is_gpu(planned, settings) else "cpu"
        for asset_key, partition in targets:
            rows.append(
                {
                    "run_id": run.run_id,
                    "job_name": run.job_name,
                    "step_key": step,
                    "asset_key": asset_key,
                    "partition": partition or run_partition,
                    "group": groups.get(asset_key, "unknown"),
                    "status": status.get(step, "unknown"),
                    "attempts": attempts[step],
                    "compute": compute,
                    "seconds": total / len(targets),
                    "started_at": first_start.get(step, 0.0),
                }
            )
    return rows


def step_costs(
    instance: dg.DagsterInstance,
    groups: Mapping[str, str],
    settings: LedgerSettings | None = None,
    exclude_run_ids: Iterable[str] = (),
) -> pd.DataFrame:
    """Step costs of the newest finished runs (at most ``max_runs``)."""
    settings = settings or LedgerSettings.load()
    excluded = set(exclude_run_ids)
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=FINISHED), limit=settings.max_runs)
    rows = [
        row
        for run in runs
        if run.run_id not in excluded
        for row in run_step_costs(instance, run, groups, settings)
    ]
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def _split_compute(costs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    table = (
        costs.pivot_table(index=keys, columns="compute", values="seconds", aggfunc="sum")
        .reindex(columns=["cpu", "gpu"])
        .fillna(0.0)
        .rename(columns={"cpu": "cpu_seconds", "gpu": "gpu_seconds"})
        .reset_index()
    )
    table.columns.name = None
    return table


def ledger_by_group(costs: pd.DataFrame) -> pd.DataFrame:
    """CPU and GPU seconds, step count and run count per asset group."""
    columns = ["group", "cpu_seconds", "gpu_seconds", "steps", "runs"]
    if costs.empty:
        return pd.DataFrame(columns=columns)
    table = _split_compute(costs, ["group"])
    counts = (
        costs.groupby("group")
        .agg(steps=("step_key", "size"), runs=("run_id", "nunique"))
        .reset_index()
    )
    table = table.merge(counts, on="group")[columns]
    return table.sort_values(["cpu_seconds", "gpu_seconds"], ascending=False).reset_index(drop=True)


def ledger_by_asset(costs: pd.DataFrame) -> pd.DataFrame:
    """CPU and GPU seconds per asset and partition (with its group)."""
    columns = ["group", "asset_key", "partition", "cpu_seconds", "gpu_seconds"]
    if costs.empty:
        return pd.DataFrame(columns=columns)
    return _split_compute(costs, ["group", "asset_key", "partition"])[columns]


@dataclass(frozen=True)
class Ledger:
    """One ledger build: every step's cost and the two roll-ups published beside it."""

    costs: pd.DataFrame
    by_group: pd.DataFrame
    by_asset: pd.DataFrame

    @property
    def runs(self) -> int:
        return int(self.costs["run_id"].nunique()) if len(self.costs) else 0

    def summary(self) -> dict[str, Any]:
        """What ``by_group.json`` holds: the run count and the per-group roll-up."""
        return {"runs": self.runs, "by_group": self.by_group.to_dict(orient="records")}


def build_ledger(
    instance: dg.DagsterInstance,
    groups: Mapping[str, str],
    settings: LedgerSettings,
    exclude_run_ids: Iterable[str] = (),
) -> Ledger:
    """The ledger over the instance's finished runs (``exclude_run_ids``: the run building it)."""
    costs = step_costs(instance, groups, settings, exclude_run_ids=list(exclude_run_ids))
    return Ledger(costs=costs, by_group=ledger_by_group(costs), by_asset=ledger_by_asset(costs))
