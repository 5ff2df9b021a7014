"""Drive the simulated fleet and land what the vehicles kept: the uploader a CLI user runs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.progress import progress_bar
from aiinfra_pipelines.vehicle.fleet_upload import upload_through_outboxes

from .landing import LandedBatch
from .simulator import EngineForVehicle, EpisodeCallback, drive_fleet
from .triggers import TriggerConfig


def drive_fleet_logs(
    *,
    vehicles: int,
    episodes: int,
    seed: int,
    console: Console | None = None,
    engine_for_vehicle: EngineForVehicle | None = None,
    on_episode: EpisodeCallback | None = None,
    shadow_for_vehicle: EngineForVehicle | None = None,
    triggers: TriggerConfig | None = None,
) -> list[tuple[str, bytes, DriveLog]]:
    """Drive ``vehicles`` × ``episodes`` with a progress bar; returns (log id, MCAP, log).

    Every uploader (the plain CLI drive and the demo's cohort drive) shows the same two bars,
    driving then MCAP encoding, so both call this; the hooks are passed to
    :func:`~aiinfra_pipelines.fleet.simulator.drive_fleet` unchanged (rollout engines, shadow
    engines, per-episode telemetry, the trigger config the cars received over OTA).
    """
    with progress_bar(console) as progress:
        task = progress.add_task("driving", total=vehicles * episodes)
        logs = drive_fleet(
            vehicles,
            episodes,
            seed,
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
            engine_for_vehicle=engine_for_vehicle,
            on_episode=on_episode,
            shadow_for_vehicle=shadow_for_vehicle,
            triggers=triggers,
        )
        encode = progress.add_task("encoding MCAP", total=len(logs))
        encoded = []
        for log in logs:
            encoded.append((log.log_id, encode_drive_log(log), log))
            progress.advance(encode)
    return encoded


def drive_and_land(
    lake: VersionedLake,
    *,
    vehicles: int,
    episodes: int,
    seed: int,
    batch_id: str | None = None,
    console: Console | None = None,
    outbox_root: Path | None = None,
) -> LandedBatch:
    """Drive, then send every kept segment through the cars' outboxes as one commit on
    ``ingest-<batch>`` (low-value segments as index records: ``vehicle.fleet_upload``)."""
    logs = drive_fleet_logs(vehicles=vehicles, episodes=episodes, seed=seed, console=console)
    if not logs:
        raise RuntimeError("no trigger fired on any vehicle: nothing to upload (try more episodes)")
    batch = batch_id or datetime.now(UTC).strftime("fleet%Y%m%dT%H%M%S") + f"-s{seed}"
    models = sorted({log.metadata["vehicle_model"] for _, _, log in logs})
    # Fleet-local vehicle numbers, not VIN fragments: commit metadata is readable by everyone.
    vehicle_ids = [f"vehicle-{index:03d}" for index in range(vehicles)]
    sent = upload_through_outboxes(
        lake,
        logs,
        batch,
        root=outbox_root,
        metadata={
            "vehicles": str(vehicles),
            "episodes": str(episodes),
            "seed": str(seed),
            "vehicle_models": ",".join(models),
            "vehicle_ids": ",".join(vehicle_ids),
        },
    )
    if sent.batch is None:
        raise RuntimeError(
            f"the cars' outboxes sent nothing for {batch}: every kept log was uploaded before "
            f"(the same seed drives the same logs) or waits for its window; refused: "
            f"{len(sent.refused)}"
        )
    return sent.batch
