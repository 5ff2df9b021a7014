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

import dataclasses
import sys
import time

import dagster as dg
from rich.console import Console
from rich.rule import Rule

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.gate_rules import gate_rules

from .cycle import DemoCycle
from .daemon import DaemonProcess
from .overlay import use_demo_resources
from .report import DemoSummary
from .settings import DemoSettings
from .state import set_aside_previous_run
from .waiting import Deadline

GPU_POOL = "gpu"


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
    defaults = DemoSettings.load()
    settings = dataclasses.replace(
        defaults,
        vehicles=vehicles or defaults.vehicles,
        episodes=episodes or defaults.episodes,
        seed=defaults.seed if seed is None else seed,
        faulty_logs=defaults.faulty_logs if faulty_logs is None else faulty_logs,
        cycles=cycles or defaults.cycles,
        timeout_s=timeout_s or defaults.timeout_s,
    )
    deadline = Deadline.after(settings.timeout_s)
    previous = set_aside_previous_run(dagster_home())
    if previous is not None:
        console.print(f"an earlier run's state was moved to {previous}; this demo starts afresh")
    resources = use_demo_resources(dagster_home())
    console.print(f"demo configuration: {resources} (resources/ with resources/demo.yaml applied)")

    instance = dg.DagsterInstance.get()
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 1)
    lake = build_lake(load_environment())
    lake.ensure_repository()

    daemon_process = DaemonProcess(
        dagster_home() / "demo" / "daemon.log",
        max_restarts=settings.daemon_restarts,
        on_restart=lambda message: console.print(f"[yellow]{message}[/]"),
    )
    summary = DemoSummary(
        dagster_home() / "demo" / "summary.json", gates_sha256=gate_rules().sha256
    )
    weak_slices: dict[str, float | None] = {}
    with daemon_process as daemon:
        cycle_runner = DemoCycle(settings, instance, lake, daemon, deadline, console)
        for cycle in range(1, settings.cycles + 1):
            record = cycle_runner.run(cycle, weak_slices)
            weak_slices = (record.get("benchmark") or {}).get("slices") or {}
            summary.add(record, total_s=time.monotonic() - started)
    summary.write(total_s=time.monotonic() - started)
    console.print(Rule())
    console.print(
        f"demo finished in {time.monotonic() - started:.0f}s; figures in {summary.path}. "
        "Open the UI with "
        f"[bold]make ui[/] (DAGSTER_HOME={dagster_home()}, AIINFRA_RESOURCES={resources}); "
        "a full rollout needs an approval: materialize `rollout` with config "
        "{model_version, approved_by} in the UI's launchpad."
    )
