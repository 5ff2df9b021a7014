"""``resources/simulation.yaml`` and the ``simulation:`` section of ``gates.yaml``.

Functions take ``config`` (the whole simulation.yaml as a mapping, ``None`` for the operator's
file) so tests pass an edited copy while assets use the file; each section is read into a typed,
validated settings class, and nothing in the simulation code carries a number of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml, resources_dir, settings_section
from aiinfra_pipelines.fleet.episode_metrics import MetricsConfig
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config
from aiinfra_pipelines.vehicle.degradation_settings import DegradationSettings

SIMULATION_CONFIG_FILE = "simulation.yaml"
GATES_CONFIG_FILE = "gates.yaml"
SCENARIOS_DIR = "scenarios"

SimulationConfig = Mapping[str, Any]


def pinned_simulation_config(config: SimulationConfig | None = None) -> SimulationConfig:
    """The whole file as one mapping, to hand to worker processes (or hash) as it is now.

    A simulation run resolves the file once and passes that mapping on, so every worker and
    every episode of the run sees the same configuration even if the file changes meanwhile.
    """
    return settings_section(SIMULATION_CONFIG_FILE, "", config).values


@dataclass(frozen=True)
class ExecutionSettings:
    """``execution``: shards of the regression library, worker processes, onnxruntime threads."""

    shards: int
    workers: int
    onnx_intra_op_threads: int

    @classmethod
    def load(cls, config: SimulationConfig | None = None) -> ExecutionSettings:
        section = settings_section(SIMULATION_CONFIG_FILE, "execution", config)
        shards = section.int("shards")
        if shards < 1:
            raise section.error("shards", f"must be >= 1, got {shards}")
        return cls(
            shards=shards,
            workers=section.int("workers"),
            onnx_intra_op_threads=section.int("onnx_intra_op_threads"),
        )


@dataclass(frozen=True)
class EpisodeSettings:
    """``episode``: scenario durations. How many seeds a scenario runs is the gate's evidence
    plan (gates.yaml ``simulation.evidence``): the power of the gate depends on it."""

    default_duration_s: float
    min_duration_s: float
    max_duration_s: float

    @classmethod
    def load(cls, config: SimulationConfig | None = None) -> EpisodeSettings:
        section = settings_section(SIMULATION_CONFIG_FILE, "episode", config)
        return cls(
            default_duration_s=section.float("default_duration_s"),
            min_duration_s=section.float("min_duration_s"),
            max_duration_s=section.float("max_duration_s"),
        )


@dataclass(frozen=True)
class ScenarioSettings:
    """What a scenario may ask for: traffic levels per road type, roads for scripted events.

    ``traffic`` maps road type → level → highway-env overrides (free-form: passed to the env).
    """

    traffic: Mapping[str, Mapping[str, Mapping[str, Any]]]
    scripted_event_road_types: tuple[str, ...]

    def traffic_levels(self, road_type: str) -> Mapping[str, Mapping[str, Any]]:
        return self.traffic.get(road_type) or {}

    @classmethod
    def load(cls, config: SimulationConfig | None = None) -> ScenarioSettings:
        simulation = settings_section(SIMULATION_CONFIG_FILE, "", config)
        roads = simulation.section("traffic")
        return cls(
            traffic={str(road): roads.raw(road) or {} for road in roads.values},
            scripted_event_road_types=tuple(
                str(road) for road in simulation.list("scripted_event_road_types")
            ),
        )


@dataclass(frozen=True)
class RegressionScenarioSettings:
    """``regression_scenarios``: how fleet badcases and failures become library scenarios."""

    exclude_badcases_mined_by: frozenset[str]
    duration_s: float
    traffic: str
    max_per_condition: int | None
    failure_flags: tuple[str, ...]
    failure_hazard: Mapping[str, Any]  # a scripted hazard's fields (scenarios validate them)

    @classmethod
    def load(cls, config: SimulationConfig | None = None) -> RegressionScenarioSettings:
        section = settings_section(SIMULATION_CONFIG_FILE, "regression_scenarios", config)
        cap = section.raw("max_per_condition", None)
        return cls(
            exclude_badcases_mined_by=frozenset(
                str(engine) for engine in section.list("exclude_badcases_mined_by", None)
            ),
            duration_s=section.float("duration_s"),
            traffic=section.str("traffic"),
            max_per_condition=None if cap is None else section.int("max_per_condition"),
            failure_flags=tuple(str(flag) for flag in section.list("failure_flags")),
            failure_hazard=dict(section.section("failure_hazard").values),
        )


def simulation_gates(gates: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``simulation:`` section of ``gates.yaml`` (or of the given gates mapping)."""
    source = load_resource_yaml(GATES_CONFIG_FILE) if gates is None else gates
    if "simulation" not in source:
        raise KeyError("gates.yaml has no `simulation:` section (regression gate budgets)")
    return source["simulation"]


def scenarios_dir() -> Path:
    """Where the base scenario files live: ``resources/scenarios/``."""
    return resources_dir() / SCENARIOS_DIR


def metrics_config(config: SimulationConfig | None = None) -> MetricsConfig:
    """``metrics``: how an episode's hard brakes and gaps are measured."""
    section = settings_section(SIMULATION_CONFIG_FILE, "metrics", config)
    return MetricsConfig(
        hard_brake_mps2=section.float("hard_brake_mps2"),
        vehicle_length_m=section.float("vehicle_length_m"),
    )


def simulator_fingerprint(
    config: SimulationConfig | None = None, fleet: FleetConfig | None = None
) -> str:
    """Identity of "how an episode is simulated and measured": the simulator version, the
    whole fleet configuration (physics, camera, degradations, planner), the car's degradation
    state machine (vehicle.yaml ``degradation``) and the metric settings.

    A cached outcome is reused only under the same fingerprint, so the sections are hashed
    exactly as the file has them.
    """
    cfg = pinned_simulation_config(config)
    payload = {
        "simulator_version": cfg["simulator_version"],
        "metrics": cfg["metrics"],
        "collisions": cfg["collisions"],
        "traffic": cfg["traffic"],
        "fleet": fleet_config(fleet),
        "degradation": {
            key: value
            for key, value in asdict(DegradationSettings.load()).items()
            if key != "version"  # vehicle.yaml's version also moves with outbox changes
        },
    }
    encoded = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]
