"""The main job: the whole loop, twice, driven only by the Dagster daemon and its sensors.

Each cycle a small fleet drives with the engines the release layer assigned (the candidate in
its rollout cohort, production or the previous-generation stack elsewhere) and uploads logs and
telemetry to an ingest branch, exactly as real cars would. From there nothing is called
directly: the real ``dagster-daemon`` ingests, mines, retrains, exports, quantizes, simulates,
certifies, shadows, rolls out and signs OTA metadata through sensors and automation. The demo
only waits for the loop to go quiet and reports what each stage published. The last cycle ends
with a closing drive (``closing.py``) whose telemetry judges the canary of the release that
cycle started rolling out.
"""

from __future__ import annotations

import sys
import time

import dagster as dg
from rich.console import Console
from rich.rule import Rule

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.ingest.partitions import BatchRef
from aiinfra_pipelines.mining.pulls import pull_weak_slices

from .closing import closing_drive
from .daemon import DaemonProcess
from .fleet_cycle import batch_name, drive_and_upload, fleet_assignment
from .overlay import demo_settings, use_demo_resources
from .report import DemoSummary, cycle_record
from .summary import (
    CycleWindow,
    print_data_summary,
    print_fleet_shadow,
    print_mining_summary,
    print_release_summary,
    print_training_summary,
)
from .waiting import (
    Deadline,
    wait_for_ingest,
    wait_for_mining,
    wait_for_telemetry,
    wait_until_quiet,
)

GPU_POOL = "gpu"
PUBLISHED_INGEST = dg.AssetKey("published_ingest")


def corrupt_copy(data: bytes) -> bytes:
    """A truncated upload (a connection dropped mid-transfer): what quarantine is for."""
    return data[: len(data) * 2 // 3]


def published_partitions(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> list[str]:
    """Batch partitions whose ingest run published to main."""
    published = instance.get_materialized_partitions(PUBLISHED_INGEST)
    return sorted(p for p in (r.tags.get("dagster/partition") for r in runs) if p in published)


def run_demo(
    *,
    vehicles: int | None = None,
    episodes: int | None = None,
    seed: int | None = None,
    faulty_logs: int | None = None,
    cycles: int | None = None,
    timeout_s: int | None = None,
    console: Console,
) -> None:
    """Run ``cycles`` turns of the loop (arguments default to ``resources/demo.yaml``)."""
    started = time.monotonic()
    if hasattr(sys.stdout, "reconfigure"):  # progress reaches a log file as it happens
        sys.stdout.reconfigure(line_buffering=True)
    settings = demo_settings()
    fleet = settings["fleet"]
    vehicles = vehicles or int(fleet["vehicles"])
    episodes = episodes or int(fleet["episodes"])
    seed = int(fleet["seed"]) if seed is None else seed
    faulty_logs = int(fleet["faulty_logs"]) if faulty_logs is None else faulty_logs
    cycles = cycles or int(settings["cycles"])
    closing_episodes = int((settings.get("closing_drive") or {}).get("episodes", 0))
    deadline = Deadline.after(timeout_s or int(settings["timeout_s"]))
    resources = use_demo_resources(dagster_home())
    console.print(f"demo configuration: {resources} (resources/ with resources/demo.yaml applied)")

    instance = dg.DagsterInstance.get()
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 1)
    lake = build_lake(load_environment())
    lake.ensure_repository()

    daemon_process = DaemonProcess(
        dagster_home() / "demo" / "daemon.log",
        max_restarts=int(settings["daemon_restarts"]),
        on_restart=lambda message: console.print(f"[yellow]{message}[/]"),
    )
    summary = DemoSummary(dagster_home() / "demo" / "summary.json")
    weak_slices: dict[str, float | None] = {}
    with daemon_process as daemon:
        for cycle in range(1, cycles + 1):
            cycle_started = time.monotonic()
            console.print(Rule(f"cycle {cycle} of {cycles}"))
            window = CycleWindow(started=time.time())
            pulls = pull_weak_slices(lake, weak_slices) if weak_slices else None
            if pulls and pulls["requested"]:
                console.print(
                    f"mining pulls {pulls['requested']} raw segment(s) of "
                    f"{', '.join(pulls['slices'])} from the cars that hold them"
                )
            assignment = fleet_assignment(lake)
            console.print(
                f"[bold]fleet[/] {vehicles} cars × {episodes} drives: {assignment.describe()}"
            )
            upload = drive_and_upload(
                lake,
                assignment,
                vehicles=vehicles,
                episodes=episodes,
                seed=seed + cycle - 1,
                batch_id=batch_name(cycle, seed),
                faulty_logs=faulty_logs if cycle == 1 else 0,
                corrupt=corrupt_copy,
                console=console,
            )
            sent = upload.outboxes
            console.print(
                f"landed {len(upload.logs.keys)} upload(s) ({sent.raw_logs} raw log(s) queued, "
                f"{sent.index_only} index-only, {sent.pulls_served} pull(s) served, "
                f"{sent.pulls_unservable} unservable) and {upload.telemetry.records} telemetry "
                f"record(s) on [cyan]{upload.logs.branch}[/]"
            )
            landed_at = time.time()
            landed = [BatchRef(upload.logs.branch, upload.logs.commit).partition_key]
            runs = wait_for_ingest(instance, landed, daemon, deadline, console)
            print_data_summary(lake, upload, runs, console)
            partitions = published_partitions(instance, runs)
            wait_for_mining(instance, partitions, daemon, deadline, console)
            print_mining_summary(lake, partitions, console)
            wait_for_telemetry(instance, upload.telemetry.branch, daemon, deadline, console)
            print_fleet_shadow(lake, upload, console)
            wait_until_quiet(instance, lake, daemon, deadline, console, float(settings["settle_s"]))
            version = print_training_summary(instance, lake, window, console)
            print_release_summary(instance, lake, window, version, console)
            closing = None
            if cycle == cycles and closing_episodes > 0:
                closing = closing_drive(
                    instance,
                    lake,
                    daemon,
                    deadline,
                    console,
                    vehicles=vehicles,
                    episodes=closing_episodes,
                    max_rounds=int(settings["closing_drive"]["max_rounds"]),
                    seed=seed + cycles,
                    batch_id=f"{batch_name(cycle, seed)}-closing",
                    settle_s=float(settings["settle_s"]),
                )
            cycle_s = time.monotonic() - cycle_started
            record = cycle_record(
                instance,
                lake,
                cycle=cycle,
                upload=upload,
                window=window,
                landed_at=landed_at,
                version=version,
                cycle_s=cycle_s,
            )
            if closing is not None:
                record["closing_drive"] = closing
            if pulls is not None:
                record["pulls"] = pulls
            weak_slices = (record.get("benchmark") or {}).get("slices") or {}
            summary.add(record, total_s=time.monotonic() - started)
            console.print(f"cycle {cycle} took {cycle_s:.0f}s")
    summary.write(total_s=time.monotonic() - started)
    console.print(Rule())
    console.print(
        f"demo finished in {time.monotonic() - started:.0f}s; figures in {summary.path}. "
        "Open the UI with "
        f"[bold]make ui[/] (DAGSTER_HOME={dagster_home()}, AIINFRA_RESOURCES={resources}); "
        "a full rollout needs an approval: materialize `rollout` with config "
        "{model_version, approved_by} in the UI's launchpad."
    )
