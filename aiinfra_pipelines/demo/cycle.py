"""One turn of the demo's loop: pull, drive and upload, then follow the daemon through ingest,
mining, telemetry, training and release, and record what each stage published.

Nothing here calls a stage directly: every step after the upload is the real daemon's, and
this module only waits for it and reports (``waiting``, ``summary``, ``report``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import dagster as dg
from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from aiinfra_pipelines.curation.trigger_proposals import TriggerProposalError
from aiinfra_pipelines.environment import build_resources
from aiinfra_pipelines.ingest.partitions import BatchRef
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.mining.pulls import pull_weak_slices
from aiinfra_pipelines.release.ota import OtaError
from aiinfra_pipelines.release.trigger_ota import TriggerApprovalError

from .closing import closing_drive
from .daemon import DaemonProcess
from .fleet_cycle import FleetUpload, batch_name, drive_and_upload, fleet_assignment
from .report import cycle_record
from .settings import DemoSettings
from .summary import (
    CycleWindow,
    print_data_summary,
    print_fleet_shadow,
    print_mining_summary,
    print_release_summary,
    print_training_summary,
    print_trigger_yield,
    trigger_yield,
)
from .triggers import propose_approve_ship
from .waiting import (
    Deadline,
    wait_for_ingest,
    wait_for_mining,
    wait_for_telemetry,
    wait_until_quiet,
)

PUBLISHED_INGEST = dg.AssetKey("published_ingest")


def corrupt_copy(data: bytes) -> bytes:
    """A truncated upload (a connection dropped mid-transfer): what quarantine is for."""
    return data[: len(data) * 2 // 3]


def published_partitions(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> list[str]:
    """Batch partitions whose ingest run published to main."""
    published = instance.get_materialized_partitions(PUBLISHED_INGEST)
    return sorted(p for p in (r.tags.get("dagster/partition") for r in runs) if p in published)


@dataclass
class DemoCycle:
    """What every cycle of one demo shares: its settings, the instance, the lake, the daemon."""

    settings: DemoSettings
    instance: dg.DagsterInstance
    lake: VersionedLake
    daemon: DaemonProcess
    deadline: Deadline
    console: Console

    def run(self, cycle: int, weak_slices: dict[str, float | None]) -> dict[str, Any]:
        """Run cycle ``cycle`` and return its record for ``summary.json``."""
        started = time.monotonic()
        self.console.print(Rule(f"cycle {cycle} of {self.settings.cycles}"))
        window = CycleWindow(started=time.time())
        pulls = self._pull(weak_slices)
        upload = self._drive_and_upload(cycle)
        landed_at = time.time()
        version = self._follow_the_loop(upload, window)
        triggers = self._triggers(cycle)
        closing = self._closing_drive(cycle)
        cycle_s = time.monotonic() - started
        record = cycle_record(
            self.instance,
            self.lake,
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
        record["triggers"] = triggers
        self.console.print(f"cycle {cycle} took {cycle_s:.0f}s")
        return record

    def _pull(self, weak_slices: dict[str, float | None]) -> dict[str, Any] | None:
        """Ask the cars for raw segments of the slices the last benchmark found weak."""
        pulls = pull_weak_slices(self.lake, weak_slices) if weak_slices else None
        if pulls and pulls["requested"]:
            self.console.print(
                f"mining pulls {pulls['requested']} raw segment(s) of "
                f"{', '.join(pulls['slices'])} from the cars that hold them"
            )
        return pulls

    def _drive_and_upload(self, cycle: int) -> FleetUpload:
        settings, console = self.settings, self.console
        assignment = fleet_assignment(self.lake)
        console.print(
            f"[bold]fleet[/] {settings.vehicles} cars × {settings.episodes} drives: "
            f"{assignment.describe()}"
        )
        upload = drive_and_upload(
            self.lake,
            assignment,
            vehicles=settings.vehicles,
            episodes=settings.episodes,
            seed=settings.seed + cycle - 1,
            batch_id=batch_name(cycle, settings.seed),
            faulty_logs=settings.faulty_logs if cycle == 1 else 0,
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
        return upload

    def _follow_the_loop(self, upload: FleetUpload, window: CycleWindow) -> str | None:
        """Wait for each stage the upload sets off and print what it published; the model
        version the cycle trained (``None`` when it trained none)."""
        instance, lake, daemon = self.instance, self.lake, self.daemon
        deadline, console = self.deadline, self.console
        landed = [BatchRef(upload.logs.branch, upload.logs.commit).partition_key]
        runs = wait_for_ingest(instance, landed, daemon, deadline, console)
        print_data_summary(lake, upload, runs, console)
        partitions = published_partitions(instance, runs)
        wait_for_mining(instance, partitions, daemon, deadline, console)
        print_mining_summary(lake, partitions, console)
        wait_for_telemetry(instance, upload.telemetry.branch, daemon, deadline, console)
        print_fleet_shadow(lake, upload, console)
        wait_until_quiet(instance, lake, daemon, deadline, console, self.settings.settle_s)
        version = print_training_summary(instance, lake, window, console)
        print_release_summary(instance, lake, window, version, console)
        return version

    def _triggers(self, cycle: int) -> dict[str, Any]:
        """The shipped trigger config's yield on its targeted slices (old vs new version), then
        the next proposal from this cycle's weak slices — approved and shipped on the
        operator's behalf when demo.yaml says so, for the next drive to adopt."""
        figures = trigger_yield(self.lake)
        print_trigger_yield(figures, self.console)
        keys = build_resources()["release_keys"]
        try:
            proposal = propose_approve_ship(
                self.lake, self.settings, keys, cycle=cycle, console=self.console
            )
        except (OtaError, TriggerApprovalError, TriggerProposalError) as error:
            self.console.print(f"[yellow]trigger proposal failed: {escape(str(error))}[/]")
            proposal = {"error": str(error)}
        return {"yield": figures, "proposal": proposal}

    def _closing_drive(self, cycle: int) -> dict[str, Any] | None:
        """After the last cycle, the drive whose telemetry judges the canary it started."""
        settings = self.settings
        if cycle != settings.cycles or settings.closing_episodes <= 0:
            return None
        return closing_drive(
            self.instance,
            self.lake,
            self.daemon,
            self.deadline,
            self.console,
            vehicles=settings.vehicles,
            episodes=settings.closing_episodes,
            max_rounds=settings.closing_max_rounds,
            seed=settings.seed + settings.cycles,
            batch_id=f"{batch_name(cycle, settings.seed)}-closing",
            settle_s=settings.settle_s,
        )
