"""Waiting for the daemon: the demo never runs an asset itself, it watches the loop work.

Ingestion and mining are waited for explicitly (one run per landed upload batch). After that
the loop is a chain of sensors (retraining → simulation → certification → shadow → rollout →
OTA), so a cycle is finished when the loop is *quiet*: no run queued or running, and none of those
sensors' plans — the same functions the sensors evaluate — would request anything new.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
from rich.console import Console

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.runs import IN_FLIGHT, RELEASE_STEP_TAG
from aiinfra_pipelines.sensors.retrain_sensor import plan_retraining
from aiinfra_pipelines.sensors.rollout_sensor import plan_release_requests
from aiinfra_pipelines.sensors.simulation_sensor import RUN_KEY_TAG, plan_regression_runs
from aiinfra_pipelines.simulation.assets import shard_partition_keys

from .daemon import DaemonProcess

TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
PUBLISHED_MINING = dg.AssetKey("published_mining")
POLL_S = 1.0
WILL_RETRY_TAG = "dagster/will_retry"


@dataclass
class Deadline:
    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def expired(self) -> bool:
        return time.monotonic() >= self.at


def poll_until(
    done: Callable[[], tuple[bool, str]],
    what: str,
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
) -> None:
    """Call ``done()`` (→ finished?, status line) every second until it is, showing progress."""
    with console.status(what) as status:
        while not deadline.expired():
            finished, line = done()
            if finished:
                return
            status.update(f"{what}: {line}")
            daemon.require_alive()
            time.sleep(POLL_S)
    raise TimeoutError(f"{what} did not finish before the demo's timeout")


def settled(run: dg.DagsterRun) -> bool:
    """Finished for good: succeeded, or failed with no automatic retry to come (Dagster tags
    each failed run with whether the daemon will re-execute it)."""
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return True
    return run.status in TERMINAL and run.tags.get(WILL_RETRY_TAG) != "true"


def wait_for_ingest(
    instance: dg.DagsterInstance,
    partitions: list[str],
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
) -> list[dg.DagsterRun]:
    """The newest ingest run of every landed batch's partition, once all have settled."""
    found: dict[str, dg.DagsterRun] = {}

    def done() -> tuple[bool, str]:
        for partition in partitions:
            runs = instance.get_runs(
                filters=dg.RunsFilter(tags={"dagster/partition": partition}), limit=1
            )
            if runs:
                found[partition] = runs[0]
        finished = [run for run in found.values() if settled(run)]
        line = f"batches with runs {len(found)}/{len(partitions)}, settled {len(finished)}"
        return len(found) == len(partitions) and len(finished) == len(found), line

    poll_until(done, "ingesting the landed batch", daemon, deadline, console)
    return [found[partition] for partition in partitions]


def wait_for_mining(
    instance: dg.DagsterInstance,
    partitions: list[str],
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
) -> None:
    """The automation sensor mines each published batch on its own; wait until all are."""

    def done() -> tuple[bool, str]:
        mined = instance.get_materialized_partitions(PUBLISHED_MINING) & set(partitions)
        return len(mined) == len(partitions), f"batches mined {len(mined)}/{len(partitions)}"

    poll_until(done, "mining the new batch", daemon, deadline, console)


def _key_has_run(instance: dg.DagsterInstance, run_key: str) -> bool:
    return bool(instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1))


def pending_work(instance: dg.DagsterInstance, lake: VersionedLake) -> list[str]:
    """What the loop's sensors would still start, judged by their own planning functions."""
    pending: list[str] = []
    decision = plan_retraining(lake)
    if decision.retrain and not _key_has_run(instance, decision.run_key):
        pending.append(f"training ({decision.reason})")

    def run_status(run_key: str) -> dg.DagsterRunStatus | None:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
        return runs[0].status if runs else None

    requests, _ = plan_regression_runs(lake, shard_partition_keys(), run_status)
    pending += [f"simulation {request.run_key}" for request in requests]
    pending += [
        f"{request.asset} {request.run_key}"
        for request in plan_release_requests(lake)
        if not _key_has_run(instance, request.run_key)
    ]
    return pending


def in_flight_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT)))


def describe_run(run: dg.DagsterRun) -> str:
    what = run.tags.get("dagster/partition") or run.tags.get(RELEASE_STEP_TAG) or ""
    return f"{run.job_name}{f' [{what}]' if what else ''} {run.status.value.lower()}"


def wait_until_quiet(
    instance: dg.DagsterInstance,
    lake: VersionedLake,
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
    settle_s: float,
) -> None:
    """Until no run is in flight and no sensor would start one, for ``settle_s`` seconds."""
    quiet_since: list[float] = []

    def done() -> tuple[bool, str]:
        running = in_flight_runs(instance)
        pending = [] if running else pending_work(instance, lake)
        if running or pending:
            quiet_since.clear()
            shown = [describe_run(run) for run in running[:3]] or pending[:2]
            return False, "; ".join(shown) + (" …" if len(running) > 3 else "")
        if not quiet_since:
            quiet_since.append(time.monotonic())
        return time.monotonic() - quiet_since[0] >= settle_s, "settling"

    poll_until(done, "the loop is running", daemon, deadline, console)


def wait_for_telemetry(
    instance: dg.DagsterInstance,
    branch: str,
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
) -> None:
    """The telemetry sensor's run for the batch on ``branch`` (its partition) has settled."""

    def done() -> tuple[bool, str]:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": branch}), limit=1)
        if not runs:
            return False, "waiting for the telemetry sensor"
        return settled(runs[0]), runs[0].status.value.lower()

    poll_until(done, "publishing fleet telemetry", daemon, deadline, console)
