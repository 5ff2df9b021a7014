"""The demo's closing drive: telemetry for the release the last cycle started rolling out.

A cycle's candidate is certified after its own fleet drove, so its canary is judged only on
the *next* drive's telemetry. Without one more drive the demo would stop with the newest
release's canary never judged. After the last cycle the fleet drives once more with the
engines the OTA repository now assigns, and lands only its telemetry (the small per-drive
records a car sends at once; the logs of that drive stay in the cars' outboxes). The rollout
sensor judges the canary on it, exactly as it would on a real fleet's next day.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from rich.console import Console
from rich.markup import escape

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.rollout_state import RolloutState
from aiinfra_pipelines.release.rollout_store import read_current

from .daemon import DaemonProcess
from .fleet_cycle import drive_for_telemetry, fleet_assignment
from .report import rollout_view
from .waiting import Deadline, wait_for_telemetry, wait_until_quiet


def _rollout_view(state: RolloutState | None) -> dict[str, Any]:
    """What the closing drive reports of the current rollout (``None`` values: none yet)."""
    return {"model_version": state.model_version if state else None, **rollout_view(state)}


def closing_drive(
    instance: dg.DagsterInstance,
    lake: VersionedLake,
    daemon: DaemonProcess,
    deadline: Deadline,
    console: Console,
    *,
    vehicles: int,
    episodes: int,
    max_rounds: int,
    seed: int,
    batch_id: str,
    settle_s: float,
) -> dict[str, Any] | None:
    """Rounds of ``episodes`` drives per car, telemetry landed after each, until the rollout
    decides (anything but "waiting" for a bigger sample) or ``max_rounds`` were driven: a
    canary of one car needs more than one round to reach its minimum frames.

    Returns what the summary records (``None`` when no rollout is underway: nothing to judge).
    """
    totals = dict.fromkeys(
        ("rounds", "drives", "candidate_drives", "frames_driven", "telemetry_records"), 0
    )
    view = _rollout_view(None)
    last: dict[str, Any] = {}
    for round_number in range(1, max_rounds + 1):
        assignment = fleet_assignment(lake)
        if assignment.rollout is None or assignment.candidate is None:
            console.print("[bold]closing drive[/] skipped: no release is rolling out")
            break
        console.print(
            f"[bold]closing drive[/] round {round_number}: {vehicles} cars × {episodes} drives, "
            f"telemetry only: {assignment.describe()}"
        )
        drive = drive_for_telemetry(
            lake,
            assignment,
            vehicles=vehicles,
            episodes=episodes,
            seed=seed + round_number - 1,
            batch_id=f"{batch_id}-{round_number}",
            console=console,
        )
        wait_for_telemetry(instance, drive.telemetry.branch, daemon, deadline, console)
        wait_until_quiet(instance, lake, daemon, deadline, console, settle_s)
        totals["rounds"] += 1
        totals["drives"] += drive.drives
        totals["candidate_drives"] += drive.candidate_drives
        totals["frames_driven"] += drive.frames_driven
        totals["telemetry_records"] += drive.telemetry.records
        state = read_current(lake)
        view, last = _rollout_view(state), state.last_event if state else {}
        console.print(
            f"[bold]rollout[/] model version {view['model_version']}: {view['status']} "
            f"at {view['stage']} — {escape(str(last.get('event', '')))}: "
            f"{escape(str(last.get('reason', ''))[:120])}"
        )
        if last.get("event") != "waiting":
            break
    if not totals["rounds"]:
        return None
    return {
        **totals,
        "model_version": view["model_version"],
        "rollout": {key: value for key, value in view.items() if key != "model_version"},
        "decision": {"event": last.get("event"), "reason": last.get("reason")},
    }
