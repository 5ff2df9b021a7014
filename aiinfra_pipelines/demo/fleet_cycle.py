"""One drive of the simulated fleet with the engines the release layer assigned, and its upload.

Each car drives with what the OTA repository would give it: the rollout candidate if its VIN is
in the current cohort, otherwise the production engine — or, before the first full release,
the previous-generation stack (the rule planner on ground-truth perception, ``rule-planner-0``).
The car queues its triggered logs in its outbox (``vehicle.fleet_upload``: low-value ones as
index records, pulls answered), drains it to ``ingest-<batch>`` and sends one telemetry record
per drive, exactly as a real uploader would; the daemon's sensors take it from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.fleet.drive import drive_fleet_logs
from aiinfra_pipelines.fleet.landing import LandedBatch
from aiinfra_pipelines.fleet.simulator import EpisodeDrive
from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.fleet.vehicles import Vehicle
from aiinfra_pipelines.ingest.views import raw_available, scene_index_view
from aiinfra_pipelines.lake.layout import (
    LOG_PREFIX,
    LOG_SUFFIX,
    MAIN_BRANCH,
    PRODUCTION_POINTER_KEY,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.operations.landing import LandedTelemetry, land_telemetry
from aiinfra_pipelines.operations.telemetry import record_from_episode
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines.release.cohorts import CANDIDATE_STATUSES, runs_candidate
from aiinfra_pipelines.release.rollout_state import SHADOW, RolloutState
from aiinfra_pipelines.release.rollout_store import read_current
from aiinfra_pipelines.vehicle.fleet_upload import (
    FleetOutboxUpload,
    car_folder,
    outbox_root,
    upload_through_outboxes,
)

from .triggers import adopt_trigger_config

CANDIDATE, CONTROL = "candidate", "control"


def engine_name(model_version: str) -> str:
    """What a car running model version ``v`` reports as its software version."""
    return f"perception-v{model_version}"


@dataclass
class FleetAssignment:
    """Which engine each car runs this drive, and which rollout that follows."""

    production: OnnxRuntimeEngine | None
    candidate: OnnxRuntimeEngine | None
    rollout: RolloutState | None
    cohort: dict[str, str] = field(default_factory=dict)  # VIN → candidate / control
    # The trigger config the cars verified over OTA (None: the one they shipped with).
    triggers: TriggerConfig | None = None

    def engine_for(self, vehicle: Vehicle) -> OnnxRuntimeEngine | None:
        in_cohort = self.candidate is not None and runs_candidate(self.rollout, vehicle.vin)
        self.cohort[vehicle.vin] = CANDIDATE if in_cohort else CONTROL
        return self.candidate if in_cohort else self.production

    def shadow_for(self, vehicle: Vehicle) -> OnnxRuntimeEngine | None:
        """Cars outside the cohort run the candidate in shadow mode (plan, never act)."""
        if self.candidate is None or self.cohort.get(vehicle.vin) == CANDIDATE:
            return None
        return self.candidate

    def describe(self) -> str:
        triggers = self.triggers.version if self.triggers else "built-in"
        return f"{self._engines()}; trigger config {triggers}"

    def _engines(self) -> str:
        production = self.production.name if self.production else "rule-planner-0"
        if self.candidate is None or self.rollout is None:
            return f"every car runs {production}"
        if self.rollout.status == SHADOW:
            return f"every car runs {production} with {self.candidate.name} in shadow"
        return (
            f"cohort {self.rollout.stage} ({self.rollout.cohort_percent}%) runs "
            f"{self.candidate.name}, the rest {production} with {self.candidate.name} in shadow"
        )


def vehicle_engine_threads() -> int:
    """onnxruntime threads of one car's engine (fleet.yaml ``drive_workers``)."""
    return settings_section("fleet.yaml", "drive_workers").int("engine_intra_op_threads")


def fleet_assignment(lake: VersionedLake) -> FleetAssignment:
    """The engines the OTA repository assigns right now (read from ``main``), and the trigger
    config the cars verified from it (``triggers.adopt_trigger_config``)."""
    spec = perception_spec()
    threads = vehicle_engine_threads()
    production = None
    if lake.object_exists(MAIN_BRANCH, PRODUCTION_POINTER_KEY):
        deployed = load_deployed_engine(lake, spec)
        production = OnnxRuntimeEngine(
            deployed.onnx_bytes,
            spec,
            name=engine_name(deployed.version),
            batch_size=1,
            intra_op_threads=threads,
        )
    rollout = read_current(lake)
    candidate = None
    # A candidate in shadow rides along in shadow mode only; in a rollout stage its cohort
    # drives with it; rolled back or completed, it is not a candidate any more.
    if rollout is not None and rollout.status in (SHADOW, *CANDIDATE_STATUSES):
        onnx = lake.get_object(MAIN_BRANCH, rollout.engine_key)
        candidate = OnnxRuntimeEngine(
            onnx,
            spec,
            name=engine_name(rollout.model_version),
            batch_size=1,
            intra_op_threads=threads,
        )
    return FleetAssignment(
        production=production,
        candidate=candidate,
        rollout=rollout,
        triggers=adopt_trigger_config(lake),
    )


@dataclass(frozen=True)
class FleetUpload:
    logs: LandedBatch
    telemetry: LandedTelemetry
    drives: int
    candidate_drives: int
    frames: int  # camera frames in the landed raw logs (a corrupted copy counts its original's)
    outboxes: FleetOutboxUpload | None = None  # what the cars' outboxes held, sent and answered


def _drive(
    assignment: FleetAssignment, *, vehicles: int, episodes: int, seed: int, console: Console
) -> tuple[list, list[EpisodeDrive]]:
    """Every car's drives with its assigned engine: the kept logs and the drives themselves."""
    drives: list[EpisodeDrive] = []
    logs = drive_fleet_logs(
        vehicles=vehicles,
        episodes=episodes,
        seed=seed,
        console=console,
        engine_for_vehicle=assignment.engine_for,
        on_episode=drives.append,
        shadow_for_vehicle=assignment.shadow_for,
        triggers=assignment.triggers,
    )
    return logs, drives


def drive_and_upload(
    lake: VersionedLake,
    assignment: FleetAssignment,
    *,
    vehicles: int,
    episodes: int,
    seed: int,
    batch_id: str,
    faulty_logs: int,
    corrupt: Callable[[bytes], bytes],
    console: Console,
) -> FleetUpload:
    """Drive, then land logs (plus ``faulty_logs`` corrupted copies) and telemetry."""
    logs, drives = _drive(
        assignment, vehicles=vehicles, episodes=episodes, seed=seed, console=console
    )
    truncated = [
        (f"{log_id}-truncated", corrupt(data), log) for log_id, data, log in logs[:faulty_logs]
    ]
    sent = upload_through_outboxes(
        lake,
        logs,
        batch_id,
        metadata={"vehicles": str(vehicles), "episodes": str(episodes), "seed": str(seed)},
        extra=truncated,
    )
    if sent.batch is None:
        raise RuntimeError(f"no car sent anything for {batch_id}: nothing to ingest")
    landed_ids = {
        key.removeprefix(LOG_PREFIX).removesuffix(LOG_SUFFIX)
        for key in sent.batch.keys
        if key.endswith(LOG_SUFFIX)
    }
    driven = {log_id: len(log.frames) for log_id, _, log in [*logs, *truncated]}
    frames = sum(count for log_id, count in driven.items() if log_id in landed_ids)
    frames += pulled_frames(lake, landed_ids - set(driven))
    # A car that kept no segment has no outbox yet: its records carry none.
    outboxes = {vin: sent.cars.get(car_folder(outbox_root(), vin).name) for vin in _vins(drives)}
    records = telemetry_records(drives, assignment, batch_id, outboxes)
    telemetry = land_telemetry(lake, batch_id, records, metadata={"seed": str(seed)})
    candidate_drives = sum(assignment.cohort.get(d.vehicle.vin) == CANDIDATE for d in drives)
    return FleetUpload(sent.batch, telemetry, len(drives), candidate_drives, frames, sent)


def pulled_frames(lake: VersionedLake, log_ids: set[str]) -> int:
    """Frames of raw logs sent on a pull: driven in an earlier cycle, indexed then from their
    index records (one scene-index row per frame)."""
    if not log_ids:
        return 0
    index = scene_index_view(lake, include_index_only=True)
    held = index[~raw_available(index)] if not index.empty else index
    return int(held["log_id"].isin(log_ids).sum()) if not held.empty else 0


def _vins(drives: list[EpisodeDrive]) -> list[str]:
    return sorted({drive.vehicle.vin for drive in drives})


def telemetry_records(
    drives: list[EpisodeDrive],
    assignment: FleetAssignment,
    batch_id: str,
    outboxes: dict[str, dict | None] | None = None,
) -> list[dict]:
    """One telemetry record per drive, tagged with the cohort the car drove in and, where
    ``outboxes`` (VIN → outbox status) has the car, its outbox after this upload."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    return [
        record_from_episode(
            drive.metrics,
            vin=drive.vehicle.vin,
            vehicle_model=drive.vehicle.model,
            software_version=drive.vehicle.software_version,
            cohort=assignment.cohort.get(drive.vehicle.vin, CONTROL),
            recorded_at=now,
            record_id=f"{batch_id}-{drive.vehicle.index}-{drive.episode_index}",
            outbox=(outboxes or {}).get(drive.vehicle.vin),
        )
        for drive in drives
    ]


@dataclass(frozen=True)
class TelemetryDrive:
    telemetry: LandedTelemetry
    drives: int
    candidate_drives: int
    frames_driven: int


def drive_for_telemetry(
    lake: VersionedLake,
    assignment: FleetAssignment,
    *,
    vehicles: int,
    episodes: int,
    seed: int,
    batch_id: str,
    console: Console,
) -> TelemetryDrive:
    """Drive and land only telemetry: the small per-drive records a car sends at once, while
    its logs wait in the car's outbox for a later upload window (the demo stops first)."""
    _, drives = _drive(assignment, vehicles=vehicles, episodes=episodes, seed=seed, console=console)
    records = telemetry_records(drives, assignment, batch_id)
    telemetry = land_telemetry(lake, batch_id, records, metadata={"seed": str(seed)})
    return TelemetryDrive(
        telemetry=telemetry,
        drives=len(drives),
        candidate_drives=sum(assignment.cohort.get(d.vehicle.vin) == CANDIDATE for d in drives),
        frames_driven=sum(int(record["frames"]) for record in records),
    )


def batch_name(cycle: int, seed: int) -> str:
    return time.strftime("demo%Y%m%dT%H%M%S", time.gmtime()) + f"-c{cycle}-s{seed}"
