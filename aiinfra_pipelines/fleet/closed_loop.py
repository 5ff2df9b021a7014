"""The closed loop of one episode: render → degrade → perceive → plan → act, with its metrics.

One runner serves both the fleet (which records every step into a drive log through an
``observer``) and regression simulation (which only needs the metrics), so "how the car drives"
has exactly one implementation. Perception comes either from ground truth (the fleet's default,
byte-identical to the logs it always produced) or from an :class:`Engine` — the camera frame as
the car saw it, after degradation, goes through ``engine.infer`` and its occupancy, lead gap and
confidence drive the same :class:`RulePlanner`, low-confidence fallback included.

Between perception and planner sits the car's degradation monitor (``vehicle.degradation``),
fed every step with the engine's confidence, its error (an engine that raises leaves the car
without perception for that step, never crashes the loop), the perception latency and the
camera frame's age (:class:`~aiinfra_pipelines.fleet.health.SimulatedHealth`: unjudged and
fresh unless injected, so episodes stay deterministic); the planner acts in the state it keeps,
and every transition is in the metrics with its step, cause and detail.

What the episode measured, on privileged ground truth (what really happened, never what the
engine believed), is defined in :mod:`.episode_metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.degradation import degrade
from aiinfra_pipelines.fleet.episode_metrics import EpisodeMetrics, EpisodeTrace, MetricsConfig
from aiinfra_pipelines.fleet.health import SimulatedHealth
from aiinfra_pipelines.fleet.perception import (
    Perception,
    fill_missing_lanes,
    perception_from_ground_truth,
)
from aiinfra_pipelines.fleet.planner import RulePlanner
from aiinfra_pipelines.fleet.scripted import ScriptedEvent, ScriptedTraffic
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.logs.model import OtherVehicle
from aiinfra_pipelines.vehicle.degradation import (
    DegradationMonitor,
    FrameHealth,
)
from aiinfra_pipelines.vehicle.degradation_settings import DegradationSettings

if TYPE_CHECKING:
    from aiinfra_pipelines.fleet.sensors import SensorRig
    from aiinfra_pipelines.fleet.sim_env import EgoState


class Engine(Protocol):
    """The engine interface as the car sees it (``aiinfra_pipelines.perception.engine.Engine``
    satisfies it; restated here because the fleet layer comes before ``perception``)."""

    name: str
    sha256: str

    def infer(self, images: np.ndarray) -> Any: ...


@dataclass(frozen=True)
class EpisodeSetup:
    """Everything that determines an episode besides the code: road, conditions, seed, length.

    ``max_steps`` policy steps are applied, so ``max_steps + 1`` frames are seen (the final
    state included), unless the episode terminates earlier (collision, end of road).
    """

    road_type: str
    weather: str
    lighting: str
    env_seed: int
    max_steps: int
    events: tuple[ScriptedEvent, ...] = ()


@dataclass(frozen=True)
class StepObservation:
    """One policy step as the car sensed it: the degraded frame, ego state and ground truth."""

    step: int
    image: np.ndarray
    ego: EgoState
    speed_mps: float  # ego speed clipped to the CAN sensor range (what the planner is given)
    others: list[OtherVehicle]
    # The recording rig's other sensors (only when run_episode is given a rig): the degraded
    # rear camera frame and the LiDAR returns (N x 3, ego frame).
    rear_image: np.ndarray | None = None
    lidar_points: np.ndarray | None = None


StepObserver = Callable[[StepObservation], None]


def engine_perception(
    engine: Engine, image: np.ndarray, lane_index: int, lane_count: int
) -> Perception:
    """The engine's view of one camera frame, with the map's lanes, in the planner's terms."""
    predictions = engine.infer(image[np.newaxis])
    return Perception(
        occupancy=fill_missing_lanes(predictions.occupancy[0], lane_index, lane_count),
        lead_gap_m=float(predictions.lead_gap_m[0]),
        confidence=float(np.clip(predictions.confidence[0], 0.0, 1.0)),
    )


def run_episode(
    setup: EpisodeSetup,
    rng: np.random.Generator,
    *,
    config: FleetConfig | None = None,
    engine: Engine | None = None,
    observer: StepObserver | None = None,
    metrics_config: MetricsConfig | None = None,
    shadow_engine: Engine | None = None,
    rig: SensorRig | None = None,
    sensor_rng: np.random.Generator | None = None,
    degradation: DegradationSettings | None = None,
    health: SimulatedHealth | None = None,
) -> EpisodeMetrics:
    """Drive one episode closed-loop and return its metrics.

    ``rng`` feeds the image degradations (the only randomness outside highway-env's seed).
    ``engine`` drives perception through ``engine.infer`` on the degraded frame; ``None``
    drives on ground-truth perception. ``observer`` sees every step before the action is
    chosen (the fleet builds its log frames there). ``shadow_engine`` runs in shadow mode, as on
    a car: it perceives the same degraded frame and its own planner decides, but never acts;
    the metrics count how often its decision matched the driven one. ``rig`` (with an
    ``observer``) also captures the rear camera, from the front camera's canvas, and the LiDAR;
    the rear frame is degraded with ``sensor_rng`` so the front camera's noise stream, and
    with it every front frame, is the same with or without the rig. ``degradation`` configures
    the car's degradation monitor (vehicle.yaml when ``None``) and ``health`` says what it is
    told about latency and sensor age (see :mod:`aiinfra_pipelines.fleet.health`).
    """
    # highway-env (and pygame, matplotlib) load here, not when the code location is imported:
    # every Dagster run process imports this module, few of them simulate.
    from aiinfra_pipelines.fleet.sim_env import isolated_behaviour_class, make_env

    loop = _ClosedLoop(
        setup,
        rng,
        cfg=fleet_config(config),
        metric_cfg=metrics_config or MetricsConfig.from_triggers(),
        engine=engine,
        shadow_engine=shadow_engine,
        observer=observer,
        recording=rig if observer is not None else None,
        rear_rng=sensor_rng if sensor_rng is not None else np.random.default_rng(setup.env_seed),
        monitor=DegradationMonitor(degradation),
        health=health or SimulatedHealth(),
    )
    with isolated_behaviour_class(loop.cfg):
        env = make_env(setup.road_type, setup.env_seed, loop.cfg)
        try:
            loop.drive(env)
        finally:
            env.close()
    return loop.metrics()


@dataclass(frozen=True)
class _Sensed:
    """One step's sensing: the degraded frames the car saw, and the truth behind them."""

    seen: np.ndarray | None
    seen_rear: np.ndarray | None
    ego: EgoState
    speed: float
    others: list[OtherVehicle]
    seconds: float  # wall-clock spent rendering, reading and degrading


class _ClosedLoop:
    """One episode's moving parts, so that each step reads sense → perceive → plan → act.

    The order of every call that draws from a random stream or touches the simulator is the
    order the fleet's logs were always produced in: equal seeds give byte-identical logs.
    """

    def __init__(
        self,
        setup: EpisodeSetup,
        rng: np.random.Generator,
        *,
        cfg: FleetConfig,
        metric_cfg: MetricsConfig,
        engine: Engine | None,
        shadow_engine: Engine | None,
        observer: StepObserver | None,
        recording: SensorRig | None,
        rear_rng: np.random.Generator,
        monitor: DegradationMonitor,
        health: SimulatedHealth,
    ) -> None:
        from aiinfra_pipelines.fleet.sim_ground_truth import GroundTruthReader
        from aiinfra_pipelines.fleet.sim_lidar import Lidar

        self.setup, self.rng, self.rear_rng = setup, rng, rear_rng
        self.cfg, self.metric_cfg = cfg, metric_cfg
        self.engine, self.shadow_engine, self.observer = engine, shadow_engine, observer
        self.recording, self.monitor, self.health = recording, monitor, health
        self.period_ns = round(1e9 / float(cfg["simulation"]["policy_frequency_hz"]))
        self.max_speed = float(cfg["can"]["max_speed_mps"])
        self.bins = [float(b) for b in cfg["perception"]["bin_edges_m"]]
        self.max_range = float(cfg["perception"]["max_range_m"])
        self.planner = RulePlanner(cfg)
        self.shadow_planner = RulePlanner(cfg) if shadow_engine is not None else None
        self.camera = EgoCamera.from_config(cfg["camera"])
        self.reader = GroundTruthReader(cfg)
        self.lidar = (
            Lidar(recording.lidar.beams, recording.lidar.range_m)
            if recording is not None and recording.lidar is not None
            else None
        )
        # Ground-truth perception with nobody watching needs no camera frame: skipping render
        # and degradation changes no outcome (neither feeds the simulation) and halves the cost.
        self.needs_frame = engine is not None or shadow_engine is not None or observer is not None
        self.trace = EpisodeTrace()
        self.scripted: ScriptedTraffic | None = None

    def drive(self, env: Any) -> None:
        """Step until the episode ends or reaches ``max_steps``, recording the final state."""
        sim = self.cfg["simulation"]
        rate_hz = float(sim["policy_frequency_hz"])
        if self.setup.events:
            self.scripted = ScriptedTraffic(
                env, self.setup.events, rate_hz, str(sim["other_vehicles_type"])
            )
        done = False
        for step in range(self.setup.max_steps + 1):
            sensed = self._sense(env, step)
            if done or step == self.setup.max_steps:
                self.trace.simulator_ms.append(sensed.seconds * 1e3)
                return
            done = self._decide_and_act(env, step, sensed)

    def metrics(self) -> EpisodeMetrics:
        return self.trace.metrics(
            engine=self.engine,
            shadow_engine=self.shadow_engine,
            dt_s=1.0 / float(self.cfg["simulation"]["policy_frequency_hz"]),
            hard_brake_mps2=self.metric_cfg.hard_brake_mps2,
            events=self.scripted.fired if self.scripted is not None else [],
        )

    def _sense(self, env: Any, step: int) -> _Sensed:
        """Render and degrade what the car sees, show it to the observer, trace the truth."""
        from aiinfra_pipelines.fleet.sim_env import ego_footprint, ego_state, render_canvas

        started = time.perf_counter()
        image = rear = None
        rear_camera = self.recording.rear if self.recording is not None else None
        if self.needs_frame:
            canvas, heading = render_canvas(env, self.camera)
            image = self.camera.image_from_canvas(canvas, heading)
            if rear_camera is not None:
                rear = rear_camera.image_from_canvas(
                    canvas, heading, self.camera.ego_on_canvas(heading)
                )
        rendered = time.perf_counter()
        ego = ego_state(env)
        read_ego = time.perf_counter()
        others = self.reader.read(env, image, rear, rear_camera)  # paints plates into both
        read_truth = time.perf_counter()
        speed = float(np.clip(ego.speed_mps, 0.0, self.max_speed))
        weather, lighting = self.setup.weather, self.setup.lighting
        seen = (
            degrade(image, weather, lighting, self.rng, self.cfg, self.camera)
            if image is not None
            else None
        )
        seen_rear = (
            degrade(rear, weather, lighting, self.rear_rng, self.cfg, rear_camera)
            if rear is not None
            else None
        )
        points = self.lidar.scan(env) if self.lidar is not None else None
        sensed_at = time.perf_counter()
        sensed = _Sensed(seen, seen_rear, ego, speed, others, sensed_at - started)
        if self.observer is not None:
            self.observer(StepObservation(step, seen, ego, speed, others, seen_rear, points))
        observed = time.perf_counter()
        self.trace.observe(
            ego,
            others,
            self.metric_cfg.vehicle_length_m,
            footprint=ego_footprint(env),
            crashed_ids=self.reader.crashed_ids(env) if ego.crashed else frozenset(),
        )
        # The observer (the fleet's log writer) is the recording's cost, not the loop's: it is
        # outside every part, as it was outside ``simulator_ms``.
        self.trace.spend("camera", (rendered - started) + (sensed_at - read_truth))
        self.trace.spend("env", read_ego - rendered)
        self.trace.spend("truth", read_truth - read_ego)
        self.trace.spend("metrics", time.perf_counter() - observed)
        return sensed

    def _decide_and_act(self, env: Any, step: int, sensed: _Sensed) -> bool:
        """Perceive, update the degradation monitor, plan, shadow-plan and step the simulator;
        whether the episode ended."""
        started = time.perf_counter()
        perception, engine_error = self._perceive(sensed)
        perceived = time.perf_counter()
        now_ns = step * self.period_ns
        status = self.monitor.update(
            FrameHealth(
                timestamp_ns=now_ns,
                confidence=None if perception is None else perception.confidence,
                engine_error=engine_error,
                latency_ms=self.health.perception_latency_ms(step, (perceived - started) * 1e3),
                sensor_timestamp_ns=now_ns - self.health.sensor_age_ns(step),
            )
        )
        decision = self.planner.act_in_state(status.state, perception, sensed.speed, status.cause)
        planned = time.perf_counter()
        self._shadow(sensed, decision.name)
        shadowed = time.perf_counter()
        if self.scripted is not None:
            self.scripted.before_step(step)
        _, _, terminated, truncated, _ = env.step(decision.action)
        stepped = time.perf_counter()
        confidence = 0.0 if perception is None else perception.confidence
        self.trace.decide(decision.name, decision.fallback, confidence)
        self.trace.degradation(step, status, engine_error is not None)
        self.trace.simulator_ms.append((sensed.seconds + stepped - planned) * 1e3)
        self.trace.perception_ms.append((perceived - started) * 1e3)
        self.trace.planner_ms.append((planned - perceived) * 1e3)
        self.trace.spend("engine", (perceived - started) + (shadowed - planned))
        self.trace.spend("planner", planned - perceived)
        self.trace.spend("env", stepped - shadowed)
        self.trace.spend("metrics", time.perf_counter() - stepped)
        return bool(terminated or truncated)  # the final state is recorded on the next step

    def _perceive(self, sensed: _Sensed) -> tuple[Perception | None, str | None]:
        """The step's perception and the engine's error line (an engine failure: the car
        drives on without perception, the monitor decides what that means)."""
        ego = sensed.ego
        if self.engine is None:
            truth = perception_from_ground_truth(
                sensed.others, ego.lane_index, ego.lane_count, self.bins, self.max_range
            )
            return truth, None
        try:
            return engine_perception(self.engine, sensed.seen, ego.lane_index, ego.lane_count), None
        except Exception as error:  # any engine failure: the car drives on
            return None, _error_line(error)

    def _shadow(self, sensed: _Sensed, driven: str) -> None:
        """Shadow mode: the second engine's own plan, compared with the driven one."""
        if self.shadow_planner is None or self.shadow_engine is None:
            return
        ego = sensed.ego
        try:
            seen = engine_perception(
                self.shadow_engine, sensed.seen, ego.lane_index, ego.lane_count
            )
        except Exception:  # a shadow engine that fails decides nothing: no match
            self.trace.shadow(False)
        else:
            self.trace.shadow(self.shadow_planner.act(seen, sensed.speed).name == driven)


def _error_line(error: Exception) -> str:
    """An engine error as one line for the transition record (runtimes append stack dumps)."""
    first = next(iter(str(error).splitlines()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
