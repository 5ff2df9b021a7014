"""The simulated fleet: drive highway-env episodes and keep the triggered segments as logs.

One episode = one vehicle driving one road type under one set of conditions. Each policy step
the car perceives (ground truth, or its perception engine when the vehicle has one ->
:class:`Perception`), plans (:class:`RulePlanner`), acts, and records a :class:`Frame` (degraded
camera image with painted plates, GPS, pose, CAN, ground truth); the loop itself is
:func:`aiinfra_pipelines.fleet.closed_loop.run_episode`, shared with regression simulation.
After the drive the vehicle-side triggers pick the segments worth uploading, and each segment
becomes one :class:`DriveLog`, its plates blurred on the car (``vehicle.anonymizer``).
Everything is derived from the seed: the same seed gives byte-identical images and identical
metadata.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from aiinfra_pipelines.fleet.closed_loop import Engine, EpisodeSetup, StepObservation, run_episode
from aiinfra_pipelines.fleet.conditions import Conditions, plan_conditions
from aiinfra_pipelines.fleet.degradation_log import events_between, frame_levels, log_events
from aiinfra_pipelines.fleet.episode_metrics import EpisodeMetrics
from aiinfra_pipelines.fleet.sensors import SensorRig
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.fleet.sim_env import road_type_settings
from aiinfra_pipelines.fleet.triggers import (
    FrameContext,
    TriggerConfig,
    evaluate_triggers,
    events_in,
    select_segments,
)
from aiinfra_pipelines.fleet.vehicles import (
    City,
    Vehicle,
    build_fleet,
    city_by_name,
    local_to_gps,
)
from aiinfra_pipelines.logs.model import METADATA_SCHEMA_VERSION, DriveLog, Frame
from aiinfra_pipelines.parallel import PoolSettings, map_in_pool, worker_state
from aiinfra_pipelines.vehicle.anonymizer import VehicleAnonymizer

NS_PER_S = 1_000_000_000
ProgressCallback = Callable[[int, int], None]
# Which engine a vehicle drives with (``None``: ground-truth perception, the rule planner alone).
EngineForVehicle = Callable[[Vehicle], Engine | None]


@dataclass
class _Recording:
    """What one episode recorded before the upload filter."""

    frames: list[Frame]
    crashed: list[bool]
    road_edges: list[str]
    metrics: EpisodeMetrics


@dataclass(frozen=True)
class EpisodeDrive:
    """One vehicle's episode: its uploaded logs and the vehicle-side metrics of the whole drive.

    ``metrics`` covers every step driven, uploaded or not: what a car's own telemetry reports
    (collision, TTC, hard brakes, fallback activations, latencies), independent of the trigger
    filter and of the MCAP logs.
    """

    vehicle: Vehicle
    episode_index: int
    conditions: Conditions
    logs: list[DriveLog]
    metrics: EpisodeMetrics


EpisodeCallback = Callable[[EpisodeDrive], None]


def drive_episode(
    vehicle: Vehicle,
    episode_index: int,
    seed: int,
    conditions: Conditions,
    config: FleetConfig | None = None,
    triggers: TriggerConfig | None = None,
    engine: Engine | None = None,
) -> list[DriveLog]:
    """Drive one episode and return the logs the vehicle would upload (possibly none).

    With an ``engine`` the car perceives through it instead of ground truth; stamp the engine's
    version into ``vehicle.software_version`` (as :func:`drive_fleet` does) so its logs say so.
    """
    return drive_episode_with_metrics(
        vehicle, episode_index, seed, conditions, config, triggers, engine
    ).logs


def drive_episode_with_metrics(
    vehicle: Vehicle,
    episode_index: int,
    seed: int,
    conditions: Conditions,
    config: FleetConfig | None = None,
    triggers: TriggerConfig | None = None,
    engine: Engine | None = None,
    shadow_engine: Engine | None = None,
) -> EpisodeDrive:
    """:func:`drive_episode`, also returning the episode's closed-loop metrics (including
    ``shadow_engine``'s agreement with the driven decisions when one runs in shadow)."""
    cfg = fleet_config(config)
    trig = triggers or TriggerConfig.load()
    rig = SensorRig.from_config(cfg)
    recording = _record_episode(
        vehicle, episode_index, seed, conditions, cfg, engine, shadow_engine, rig
    )
    transitions = recording.metrics.degradation_transitions
    context = FrameContext(
        weather=conditions.weather,
        lighting=conditions.lighting,
        road_type=conditions.road_type,
        crashed=recording.crashed,
        road_edges=recording.road_edges,
        degradation_levels=frame_levels(transitions, len(recording.frames)),
    )
    degradation = log_events(transitions, recording.frames)
    events = evaluate_triggers(recording.frames, context, trig)
    anonymizer = VehicleAnonymizer.from_settings()
    logs = []
    for segment_index, (start, end) in enumerate(select_segments(recording.frames, events, trig)):
        frames = recording.frames[start:end]
        recorded_at = _utc(frames[0].timestamp_ns)
        metadata = {
            "metadata_schema_version": METADATA_SCHEMA_VERSION,
            "log_id": _log_id(recorded_at, seed, vehicle.index, episode_index, segment_index),
            "vin": vehicle.vin,
            "vehicle_model": vehicle.model,
            "sensor_config_version": vehicle.sensor_config_version,
            "software_version": vehicle.software_version,
            "trigger_config_version": trig.version,
            "city": conditions.city,
            "weather": conditions.weather,
            "lighting": conditions.lighting,
            "road_type": conditions.road_type,
            "recorded_at": recorded_at.isoformat(timespec="milliseconds"),
        }
        segment_events = events_in(events, frames[0].timestamp_ns, frames[-1].timestamp_ns)
        recording_spec = rig.recording_for(vehicle.index, vehicle.sensor_config_version)
        raw = DriveLog(
            metadata=metadata,
            frames=frames,
            events=segment_events,
            recording=recording_spec,
            degradation=events_between(
                degradation, frames[0].timestamp_ns, frames[-1].timestamp_ns
            ),
        )
        logs.append(anonymizer.anonymize(raw))  # on the car, before the log is written
    return EpisodeDrive(vehicle, episode_index, conditions, logs, recording.metrics)


def drive_fleet(
    n_vehicles: int,
    episodes: int,
    seed: int,
    on_progress: ProgressCallback | None = None,
    software_version: str | None = None,
    config: FleetConfig | None = None,
    triggers: TriggerConfig | None = None,
    engine_for_vehicle: EngineForVehicle | None = None,
    on_episode: EpisodeCallback | None = None,
    shadow_for_vehicle: EngineForVehicle | None = None,
) -> list[DriveLog]:
    """Drive ``episodes`` episodes with each of ``n_vehicles`` cars; all uploaded logs.

    ``software_version`` is the engine the fleet runs (fleet.yaml's default, the rule planner,
    when ``None``). ``engine_for_vehicle(vehicle)`` lets a rollout cohort drive with a given
    engine: a vehicle it returns an engine for perceives through it and its logs carry the
    engine's ``name`` as ``software_version``; ``None`` keeps ground-truth perception.
    ``on_progress(done, total)`` is called after every episode so a Dagster asset can report
    progress, and ``on_episode(drive)`` receives every episode's vehicle-side metrics
    (telemetry). ``shadow_for_vehicle(vehicle)`` names an engine the car runs in shadow mode
    (perceives and plans, never acts). Conditions follow fleet.yaml's ``conditions`` mix.
    """
    cfg = fleet_config(config)
    trig = triggers or TriggerConfig.load()
    vehicles = build_fleet(n_vehicles, software_version, cfg)
    plan = plan_conditions([v.city for v in vehicles], episodes, seed, cfg)
    jobs = []
    for vehicle, row in zip(vehicles, plan, strict=True):
        engine = engine_for_vehicle(vehicle) if engine_for_vehicle is not None else None
        shadow = shadow_for_vehicle(vehicle) if shadow_for_vehicle is not None else None
        if engine is not None:
            vehicle = replace(vehicle, software_version=str(engine.name))
        jobs.append(_VehicleJob(vehicle, list(row), seed, engine, shadow))
    total = n_vehicles * episodes
    logs: list[DriveLog] = []
    done = 0
    # Cars drive independently: one per worker process (highway-env is single-threaded Python).
    # Results come back in fleet order, so the logs and telemetry do not depend on the pool.
    pool = PoolSettings.load("fleet.yaml", "drive_workers")
    for drives in map_in_pool(_drive_vehicle, jobs, {"config": cfg, "triggers": trig}, pool):
        for drive in drives:
            logs.extend(drive.logs)
            if on_episode is not None:
                on_episode(drive)
            done += 1
            if on_progress is not None:
                on_progress(done, total)
    return logs


@dataclass(frozen=True)
class _VehicleJob:
    """One car's drives for :func:`drive_fleet`'s pool (picklable: engines send ONNX bytes)."""

    vehicle: Vehicle
    conditions: list[Conditions]
    seed: int
    engine: Engine | None
    shadow: Engine | None


def _drive_vehicle(job: _VehicleJob) -> list[EpisodeDrive]:
    state = worker_state()
    return [
        drive_episode_with_metrics(
            job.vehicle,
            episode_index,
            job.seed,
            conditions,
            state["config"],
            state["triggers"],
            job.engine,
            job.shadow,
        )
        for episode_index, conditions in enumerate(job.conditions)
    ]


def _record_episode(
    vehicle: Vehicle,
    episode_index: int,
    seed: int,
    conditions: Conditions,
    cfg: FleetConfig,
    engine: Engine | None = None,
    shadow_engine: Engine | None = None,
    rig: SensorRig | None = None,
) -> _Recording:
    """Run the closed loop and record every policy step (before the upload filter)."""
    rate_hz = float(cfg["simulation"]["policy_frequency_hz"])
    dt_s = 1.0 / rate_hz
    period_ns = round(NS_PER_S / rate_hz)
    road = road_type_settings(conditions.road_type, cfg)
    max_steps = round(float(road["max_duration_s"]) * rate_hz)
    can = cfg["can"]

    sequence = np.random.SeedSequence([seed, vehicle.index, episode_index])
    env_seed = int(sequence.generate_state(1)[0])
    rng = np.random.default_rng(sequence.spawn(1)[0])
    # The rig's own noise stream (spawned second): the front camera's frames do not depend on
    # which other sensors the car carries.
    sensor_rng = np.random.default_rng(sequence.spawn(1)[0])
    spread = float(cfg["fleet"]["episode_spread_m"])
    offset_east, offset_north = rng.uniform(-spread, spread, size=2)
    origin = city_by_name(conditions.city, cfg)
    start = _episode_start(seed, vehicle.index, episode_index, cfg)
    record = _FrameRecorder(
        start_ns=int(start.timestamp()) * NS_PER_S,
        period_ns=period_ns,
        dt_s=dt_s,
        offset_m=(offset_east, offset_north),
        origin=origin,
        can=can,
    )
    setup = EpisodeSetup(
        road_type=conditions.road_type,
        weather=conditions.weather,
        lighting=conditions.lighting,
        env_seed=env_seed,
        max_steps=max_steps,
    )
    metrics = run_episode(
        setup,
        rng,
        config=cfg,
        engine=engine,
        observer=record,
        shadow_engine=shadow_engine,
        rig=rig,
        sensor_rng=sensor_rng,
    )
    return _Recording(
        frames=record.frames, crashed=record.crashed, road_edges=record.edges, metrics=metrics
    )


class _FrameRecorder:
    """The observer that turns each closed-loop step into a log frame: GPS from the episode's
    origin and offset, CAN signals with acceleration from the previous step's speed."""

    def __init__(
        self,
        *,
        start_ns: int,
        period_ns: int,
        dt_s: float,
        offset_m: tuple[float, float],
        origin: City,
        can: Mapping[str, Any],
    ) -> None:
        self.start_ns, self.period_ns, self.dt_s = start_ns, period_ns, dt_s
        self.offset_m, self.origin, self.can = offset_m, origin, can
        self.frames: list[Frame] = []
        self.crashed: list[bool] = []
        self.edges: list[str] = []
        self.previous_speed: float | None = None

    def __call__(self, observation: StepObservation) -> None:
        ego, speed = observation.ego, observation.speed_mps
        previous = self.previous_speed
        accel = 0.0 if previous is None else (speed - previous) / self.dt_s
        self.previous_speed = speed
        east, north = self.offset_m[0] + ego.east_m, self.offset_m[1] + ego.north_m
        latitude, longitude = local_to_gps(east, north, self.origin)
        self.frames.append(
            Frame(
                timestamp_ns=self.start_ns + observation.step * self.period_ns,
                image=observation.image,
                latitude=latitude,
                longitude=longitude,
                x=float(east),
                y=float(north),
                heading=ego.heading_rad,
                **_can_signals(speed, accel, ego.steering_rad, self.can),
                lane_index=ego.lane_index,
                lane_count=ego.lane_count,
                others=observation.others,
                rear_image=observation.rear_image,
                lidar_points=observation.lidar_points,
            )
        )
        self.crashed.append(ego.crashed)
        self.edges.append(ego.road_edge)


def _can_signals(
    speed: float, accel: float, steering: float, can: Mapping[str, Any]
) -> dict[str, float]:
    """CAN values clipped to the sensor ranges in fleet.yaml (what a real bus would report)."""
    max_accel = float(can["max_abs_accel_mps2"])
    max_steer = float(can["max_abs_steering_rad"])
    accel = float(np.clip(accel, -max_accel, max_accel))
    return {
        "speed_mps": speed,
        "accel_mps2": accel,
        "steering_rad": float(np.clip(steering, -max_steer, max_steer)),
        "brake": float(np.clip(-accel / float(can["full_brake_decel_mps2"]), 0.0, 1.0)),
    }


def _episode_start(seed: int, vehicle_index: int, episode_index: int, cfg: FleetConfig) -> datetime:
    """Deterministic wall-clock start: base time + seed-derived day + fleet spacing."""
    times = cfg["time"]
    base = datetime.fromisoformat(str(times["base_time"])).astimezone(UTC)
    day = int(np.random.SeedSequence([seed]).generate_state(1)[0]) % int(times["seed_spread_days"])
    return base + timedelta(
        days=day,
        seconds=vehicle_index * int(times["vehicle_spacing_s"])
        + episode_index * int(times["episode_spacing_s"]),
    )


def _utc(timestamp_ns: int) -> datetime:
    """A nanosecond Unix timestamp as an aware UTC datetime (microsecond precision)."""
    seconds, remainder = divmod(timestamp_ns, NS_PER_S)
    return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=remainder // 1000)


def _log_id(
    recorded_at: datetime, seed: int, vehicle_index: int, episode_index: int, segment: int
) -> str:
    """``<UTC time>-<hash>``: sortable, unique, and free of the VIN (no personal data in ids)."""
    digest = hashlib.sha256(f"{seed}|{vehicle_index}|{episode_index}|{segment}".encode())
    return f"{recorded_at:%Y%m%dT%H%M%S}-{digest.hexdigest()[:10]}"
