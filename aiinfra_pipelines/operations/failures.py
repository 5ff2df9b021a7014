"""Failures of the loop, recorded where an operator looks: the UI and the lake.

``loop_failures`` is an asset *spec* in group ``operations`` (nothing computes it): the
run-failure sensor reports an observation on it for every failed run, so the asset's page in
the UI is a timeline of what broke, with the job, the failed steps and their errors in the
metadata. The same record goes to ``operations/failures/<run id>.json`` on ``main`` (by
write–audit–publish on its own branch), so the history survives the instance's event log and
can be queried beside the data the failure concerned.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import dagster as dg
from dagster import DagsterEventType

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.runs import TAG_PREFIX

from .cost_ledger import step_plan

GROUP = "operations"
LOOP_FAILURES = dg.AssetKey("loop_failures")
FAILURES_PREFIX = "operations/failures/"
MAX_ERROR_CHARS = 2000

loop_failures = dg.AssetSpec(
    LOOP_FAILURES,
    group_name=GROUP,
    kinds={"dagster"},
    description=(
        "One observation per failed run of the loop (run-failure sensor): job, partition, "
        "failed steps and their errors. Records also land in operations/failures/ on main."
    ),
)


def failure_record_key(run_id: str) -> str:
    return f"{FAILURES_PREFIX}{run_id}.json"


def _root_cause(error: Any) -> Any:
    """The innermost error of a chain: Dagster wraps user errors in a step-execution error
    whose own message says only which op failed."""
    while error is not None and getattr(error, "cause", None) is not None:
        error = error.cause
    return error


def failure_record(
    instance: dg.DagsterInstance, run: dg.DagsterRun, failure_event: dg.DagsterEvent
) -> dict[str, Any]:
    """What failed in ``run``: every failed step with its error, and the run's context.

    Built only from the instance's records of the run, so it is the same whenever it is built
    (a sensor re-evaluating the same failure writes identical bytes).
    """
    steps = []
    for record in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_FAILURE):
        event = record.dagster_event
        error = _root_cause(getattr(event.event_specific_data, "error", None))
        steps.append(
            {
                "step_key": event.step_key,
                "error_class": getattr(error, "cls_name", None) or "",
                "error": (getattr(error, "message", "") or event.message or "")[:MAX_ERROR_CHARS],
                "at": datetime.fromtimestamp(record.timestamp, UTC).isoformat(),
            }
        )
    end = instance.get_run_record_by_id(run.run_id)
    ended = end.end_time if end is not None and end.end_time else None
    return {
        "run_id": run.run_id,
        "root_run_id": run.root_run_id or run.run_id,
        "job_name": run.job_name,
        "partition": run.tags.get("dagster/partition", ""),
        "assets": sorted(
            {key.to_user_string() for key in run.asset_selection or []}
            or {key for step in step_plan(instance, run).values() for key in step["assets"]}
        ),
        "run_key": run.tags.get("dagster/run_key", ""),
        "sensor": run.tags.get("dagster/sensor_name", ""),
        "tags": {k: v for k, v in sorted(run.tags.items()) if k.startswith(TAG_PREFIX)},
        "message": (failure_event.message or "")[:MAX_ERROR_CHARS],
        "failed_steps": steps,
        "failed_at": datetime.fromtimestamp(ended, UTC).isoformat() if ended else "",
    }


def failure_metadata(record: dict[str, Any], lake_key: str, commit: str) -> dict[str, Any]:
    """The observation's metadata: readable in the UI at a glance."""
    steps = record["failed_steps"]
    table = "\n".join(
        f"| `{step['step_key']}` | {step['error_class']} | "
        f"{step['error'].splitlines()[0][:200].replace('|', '/') if step['error'] else ''} |"
        for step in steps
    )
    return {
        "run_id": record["run_id"],
        "job_name": record["job_name"],
        "partition": record["partition"],
        "assets": dg.MetadataValue.json(record["assets"]),
        "failed_steps": dg.MetadataValue.md(
            "| step | error | message |\n| --- | --- | --- |\n" + table if steps else "none"
        ),
        "message": record["message"][:500],
        "lake_record": f"lakefs://main/{lake_key}",
        "lake_commit": commit,
    }


def record_failure(
    lake: VersionedLake,
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    failure_event: dg.DagsterEvent,
) -> tuple[dict[str, Any], str]:
    """Publish the failure record to main and report it on ``loop_failures``.

    Returns (record, main commit). Writing on a branch of its own
    (``run-failure-<run id>-publish-<hash>``) keeps it apart from the failed run's own branch,
    which stays for inspection.
    """
    record = failure_record(instance, run, failure_event)
    key = failure_record_key(run.run_id)
    commit = publish_objects(
        lake,
        f"failure-{run.run_id}",
        {key: json_document(record)},
        f"failure of run {run.run_id} ({run.job_name})",
        {"kind": "loop-failure", "failed_run_id": run.run_id, "job_name": run.job_name},
    )
    instance.report_runless_asset_event(
        dg.AssetObservation(
            asset_key=LOOP_FAILURES,
            partition=None,
            metadata=failure_metadata(record, key, commit),
        )
    )
    return record, commit
