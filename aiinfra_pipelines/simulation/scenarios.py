"""Scenarios: what one closed-loop regression episode is, parsed and validated from YAML.

A scenario fixes everything that decides an episode besides the engine: road type, weather and
lighting (rendered as camera degradations, optionally harsher than the fleet's defaults),
traffic density, duration, seed and scripted hazards (``cut_in``, ``slow_lead``; see
:mod:`aiinfra_pipelines.fleet.scripted`). Its ``version`` is a hash of exactly those fields, so
a cached outcome is tied to the definition it was simulated from.

Base scenarios come from ``resources/scenarios/*.yaml``, one *family* per file::

    family: highway_cut_in            # scenario ids start with it (default: the file name)
    description: An aggressive driver cuts in and brakes.
    scenario:                         # the fields shared by the family
      road_type: highway
      weather: clear
      lighting: day
      traffic: normal                 # a level of simulation.yaml `traffic:` for the road type
      duration_s: 8
      events:
        - {type: cut_in, at_s: 2.0, gap_m: 12.0, side: left, speed_delta_mps: -4.0}
    matrix:                           # optional: the cartesian product becomes one scenario each
      lighting: [day, night]
      events.0.gap_m: [10.0, 20.0]    # dotted paths reach into events

Ids are ``<family>`` or ``<family>-<value>-<value>...`` (matrix values in file order). Any
mistake — unknown key, value outside the vocabulary, a hazard on a road without lanes for it —
is a :class:`ScenarioError` naming the file, the scenario and the field.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from aiinfra_pipelines.fleet.closed_loop import EpisodeSetup
from aiinfra_pipelines.fleet.conditions import LIGHTINGS, ROAD_TYPES, WEATHERS
from aiinfra_pipelines.fleet.scripted import SIDE_LEFT, SIDE_RIGHT, CutIn, ScriptedEvent, SlowLead
from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config, with_overrides
from aiinfra_pipelines.ingest.tables import slice_name

from .settings import EpisodeSettings, ScenarioSettings, scenarios_dir

KIND_BASE = "base"
KIND_BADCASE = "badcase"
KIND_FLEET_FAILURE = "fleet_failure"
KINDS = (KIND_BASE, KIND_BADCASE, KIND_FLEET_FAILURE)

FILE_KEYS = frozenset({"family", "description", "scenario", "matrix"})
SCENARIO_KEYS = (
    "road_type",
    "weather",
    "lighting",
    "traffic",
    "duration_s",
    "seed",
    "events",
    "target_speeds_mps",
    "degradation",
)
# Per hazard type: required parameters, optional parameters.
EVENT_PARAMETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cut_in": (frozenset({"at_s", "gap_m"}), frozenset({"side", "speed_delta_mps", "clear_m"})),
    "slow_lead": (
        frozenset({"gap_m", "speed_mps"}),
        frozenset({"brake_at_s", "brake_to_mps", "clear_m"}),
    ),
}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_DEGRADATION_STREAM = 0x5CE7  # separates the degradation rng from highway-env's seed
_SEED_SPACE = 2**32


class ScenarioError(ValueError):
    """A scenario definition is invalid; the message names file, scenario and field."""


@dataclass(frozen=True)
class Scenario:
    """One regression scenario. ``source`` is provenance (never part of ``version``)."""

    id: str
    kind: str
    family: str
    road_type: str
    weather: str
    lighting: str
    traffic: str
    duration_s: float
    seed: int
    events: tuple[dict[str, Any], ...] = ()
    target_speeds_mps: tuple[float, ...] | None = None
    degradation: dict[str, dict[str, float]] = field(default_factory=dict)
    description: str = ""
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def slice(self) -> str:
        return slice_name(self.lighting, self.weather, self.road_type)

    def definition(self) -> dict[str, Any]:
        """The fields that decide the episode (what ``version`` hashes)."""
        return {
            "road_type": self.road_type,
            "weather": self.weather,
            "lighting": self.lighting,
            "traffic": self.traffic,
            "duration_s": float(self.duration_s),
            "seed": int(self.seed),
            "events": [dict(e) for e in self.events],
            "target_speeds_mps": (
                None if self.target_speeds_mps is None else list(self.target_speeds_mps)
            ),
            "degradation": self.degradation,
        }

    @property
    def version(self) -> str:
        encoded = json.dumps(self.definition(), sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "kind": self.kind,
            "family": self.family,
            "description": self.description,
            "slice": self.slice,
            **self.definition(),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        speeds = data.get("target_speeds_mps")
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            family=str(data.get("family", "")),
            road_type=str(data["road_type"]),
            weather=str(data["weather"]),
            lighting=str(data["lighting"]),
            traffic=str(data["traffic"]),
            duration_s=float(data["duration_s"]),
            seed=int(data["seed"]),
            events=tuple(dict(e) for e in data.get("events") or ()),
            target_speeds_mps=None if speeds is None else tuple(float(s) for s in speeds),
            degradation={k: dict(v) for k, v in (data.get("degradation") or {}).items()},
            description=str(data.get("description", "")),
            source=dict(data.get("source") or {}),
        )


def derived_seed(*parts: str) -> int:
    """A 32-bit seed from strings (scenario id, source log id + SHA-256): stable everywhere."""
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()
    return int(digest[:8], 16) % _SEED_SPACE


def scenario_seeds(scenario: Scenario, count: int) -> list[int]:
    """The first ``count`` seeds of a scenario's seed sequence: its own seed first (so one seed
    reproduces the single-episode runs), then seed ``i`` derived from the scenario's content
    (``version``, which hashes every field that decides an episode, the own seed included)
    and ``i``.

    A pure function of content: every engine, run, machine and cycle drives the same seeds of
    a scenario, and a longer sequence extends a shorter one (the gate's stages add seeds).
    """
    if count < 1:
        raise ValueError(f"a scenario runs with at least one seed, got {count}")
    version = scenario.version
    derived = [derived_seed(version, str(i)) for i in range(1, count)]
    return [int(scenario.seed), *derived]


# ------------------------------------------------------------------------------ parsing files
def load_base_scenarios(
    directory: Path | None = None,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
) -> list[Scenario]:
    """Every scenario of every ``*.yaml`` family in ``directory`` (default resources/scenarios),
    sorted by id. Duplicate ids across files are an error."""
    folder = Path(directory) if directory is not None else scenarios_dir()
    if not folder.is_dir():
        raise ScenarioError(f"scenario folder not found: {folder}")
    scenarios: dict[str, Scenario] = {}
    origin: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")):
        for scenario in parse_scenario_file(path, config, fleet):
            if scenario.id in scenarios:
                raise ScenarioError(
                    f"{path}: scenario id {scenario.id!r} is already defined in "
                    f"{origin[scenario.id]}"
                )
            scenarios[scenario.id] = scenario
            origin[scenario.id] = str(path)
    return [scenarios[key] for key in sorted(scenarios)]


def parse_scenario_file(
    path: Path, config: dict[str, Any] | None = None, fleet: FleetConfig | None = None
) -> list[Scenario]:
    """The scenarios of one family file (see the module docstring for the format)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    return parse_family(raw, str(path), default_family=path.stem, config=config, fleet=fleet)


def parse_family(
    raw: Any,
    where: str,
    *,
    default_family: str,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
) -> list[Scenario]:
    family, base, matrix = _family_parts(raw, where, default_family)
    combos = list(itertools.product(*matrix.values())) if matrix else [()]
    scenarios = []
    for combo in combos:
        fields = copy.deepcopy(dict(base))
        for key, value in zip(matrix, combo, strict=True):
            _set_path(fields, str(key), value, f"{where}: matrix.{key}")
        scenario_id = "-".join([family, *(_slug(value) for value in combo)])
        scenarios.append(
            build_scenario(
                fields,
                scenario_id=scenario_id,
                kind=KIND_BASE,
                family=family,
                description=str(raw.get("description", "")),
                where=f"{where} [{scenario_id}]",
                config=config,
                fleet=fleet,
            )
        )
    ids = [s.id for s in scenarios]
    if len(set(ids)) != len(ids):
        raise ScenarioError(f"{where}: matrix values give duplicate scenario ids {ids}")
    return scenarios


def _family_parts(
    raw: Any, where: str, default_family: str
) -> tuple[str, Mapping[str, Any], Mapping[str, list[Any]]]:
    """A family file's name, base scenario and matrix, each checked for its shape."""
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected a mapping at the top level")
    unknown = set(raw) - FILE_KEYS
    if unknown:
        raise ScenarioError(
            f"{where}: unknown top-level key(s) {sorted(unknown)}; allowed: {sorted(FILE_KEYS)}"
        )
    family = str(raw.get("family", default_family))
    if not _NAME_RE.match(family):
        raise ScenarioError(f"{where}: family {family!r} must match {_NAME_RE.pattern}")
    base = raw.get("scenario")
    if not isinstance(base, Mapping):
        raise ScenarioError(f"{where}: `scenario:` must be a mapping of scenario fields")
    matrix = raw.get("matrix") or {}
    if not isinstance(matrix, Mapping):
        raise ScenarioError(f"{where}: `matrix:` must map a field to a list of values")
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"{where}: matrix.{key} must be a non-empty list")
    return family, base, matrix


def build_scenario(
    fields: Mapping[str, Any],
    *,
    scenario_id: str,
    kind: str,
    family: str,
    description: str = "",
    source: Mapping[str, Any] | None = None,
    where: str = "",
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
) -> Scenario:
    """Validate ``fields`` (the scenario keys) and build the scenario; defaults from config."""
    where = where or scenario_id
    settings = ScenarioSettings.load(config)
    episode = EpisodeSettings.load(config)
    fleet_cfg = fleet_config(fleet)
    unknown = set(fields) - set(SCENARIO_KEYS)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown scenario field(s) {sorted(unknown)}; allowed: {list(SCENARIO_KEYS)}"
        )
    for name in ("road_type", "weather", "lighting"):
        if name not in fields:
            raise ScenarioError(f"{where}: missing required field {name!r}")
    road_type = _choice(fields["road_type"], ROAD_TYPES, where, "road_type")
    weather = _choice(fields["weather"], WEATHERS, where, "weather")
    lighting = _choice(fields["lighting"], LIGHTINGS, where, "lighting")
    levels = settings.traffic_levels(road_type)
    traffic = str(fields.get("traffic", "normal"))
    if traffic not in levels:
        raise ScenarioError(
            f"{where}: traffic {traffic!r} is not defined for road type {road_type!r} in "
            f"simulation.yaml (levels: {sorted(levels)})"
        )
    duration = _number(fields.get("duration_s", episode.default_duration_s), where, "duration_s")
    low, high = episode.min_duration_s, episode.max_duration_s
    if not low <= duration <= high:
        raise ScenarioError(f"{where}: duration_s {duration} is outside [{low}, {high}]")
    seed = fields.get("seed", derived_seed(scenario_id))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_SPACE:
        raise ScenarioError(f"{where}: seed must be an integer in [0, 2**32), got {seed!r}")
    events = _events(fields.get("events") or [], where, road_type, duration, settings)
    speeds = fields.get("target_speeds_mps")
    if speeds is not None:
        speeds = _target_speeds(speeds, where)
    degradation = _degradation(fields.get("degradation") or {}, where, fleet_cfg)
    if kind not in KINDS:
        raise ScenarioError(f"{where}: kind {kind!r} is not one of {KINDS}")
    return Scenario(
        id=scenario_id,
        kind=kind,
        family=family,
        road_type=road_type,
        weather=weather,
        lighting=lighting,
        traffic=traffic,
        duration_s=duration,
        seed=int(seed),
        events=events,
        target_speeds_mps=speeds,
        degradation=degradation,
        description=description,
        source=dict(source or {}),
    )


def _choice(value: Any, allowed: Sequence[str], where: str, name: str) -> str:
    if value not in allowed:
        raise ScenarioError(f"{where}: {name} {value!r} is not one of {tuple(allowed)}")
    return str(value)


def _number(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def _events(
    raw: Any, where: str, road_type: str, duration: float, settings: ScenarioSettings
) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list):
        raise ScenarioError(f"{where}: events must be a list of hazards")
    if raw and road_type not in settings.scripted_event_road_types:
        raise ScenarioError(
            f"{where}: scripted events need a straight multi-lane road; road type {road_type!r} "
            f"is not in simulation.yaml scripted_event_road_types "
            f"{list(settings.scripted_event_road_types)}"
        )
    events = []
    for index, event in enumerate(raw):
        at = f"{where}: events[{index}]"
        if not isinstance(event, Mapping) or "type" not in event:
            raise ScenarioError(f"{at}: each event is a mapping with a `type`")
        kind = event["type"]
        if kind not in EVENT_PARAMETERS:
            raise ScenarioError(f"{at}: type {kind!r} is not one of {sorted(EVENT_PARAMETERS)}")
        required, optional = EVENT_PARAMETERS[kind]
        params = {k: v for k, v in event.items() if k != "type"}
        missing = required - set(params)
        if missing:
            raise ScenarioError(f"{at}: {kind} needs {sorted(missing)}")
        unknown = set(params) - required - optional
        if unknown:
            raise ScenarioError(
                f"{at}: unknown {kind} parameter(s) {sorted(unknown)}; "
                f"allowed: {sorted(required | optional)}"
            )
        clean: dict[str, Any] = {"type": kind}
        for name, value in sorted(params.items()):
            if name == "side":
                clean[name] = _choice(value, (SIDE_LEFT, SIDE_RIGHT), at, "side")
            else:
                clean[name] = _number(value, at, name)
        _check_event(clean, at, duration)
        events.append(clean)
    return tuple(events)


def _check_event(event: dict[str, Any], at: str, duration: float) -> None:
    for name in ("gap_m", "clear_m"):
        if name in event and event[name] <= 0:
            raise ScenarioError(f"{at}: {name} must be positive, got {event[name]}")
    for name in ("speed_mps", "brake_to_mps"):
        if name in event and event[name] < 0:
            raise ScenarioError(f"{at}: {name} must not be negative, got {event[name]}")
    for name in ("at_s", "brake_at_s"):
        if name in event and not 0 <= event[name] < duration:
            raise ScenarioError(
                f"{at}: {name} {event[name]} is outside the episode [0, {duration})"
            )
    if ("brake_at_s" in event) != ("brake_to_mps" in event):
        raise ScenarioError(f"{at}: brake_at_s and brake_to_mps go together")


def _target_speeds(raw: Any, where: str) -> tuple[float, ...]:
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(f"{where}: target_speeds_mps must be a non-empty list")
    speeds = tuple(_number(v, where, "target_speeds_mps") for v in raw)
    if any(s < 0 for s in speeds) or any(b <= a for a, b in itertools.pairwise(speeds)):
        raise ScenarioError(f"{where}: target_speeds_mps must be increasing and >= 0: {raw}")
    return speeds


def _degradation(raw: Any, where: str, fleet: FleetConfig) -> dict[str, dict[str, float]]:
    """Overrides of fleet.yaml ``degradation`` parameters (e.g. a denser fog), validated."""
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: degradation must map a condition to parameter overrides")
    known = fleet["degradation"]
    clean: dict[str, dict[str, float]] = {}
    for condition, params in sorted(raw.items()):
        if condition not in known:
            raise ScenarioError(
                f"{where}: degradation.{condition} is not a fleet.yaml degradation "
                f"(known: {sorted(known)})"
            )
        if not isinstance(params, Mapping):
            raise ScenarioError(f"{where}: degradation.{condition} must be a mapping")
        unknown = set(params) - set(known[condition])
        if unknown:
            raise ScenarioError(
                f"{where}: unknown degradation.{condition} parameter(s) {sorted(unknown)}; "
                f"known: {sorted(known[condition])}"
            )
        clean[str(condition)] = {
            str(k): _number(v, where, f"degradation.{condition}.{k}")
            for k, v in sorted(params.items())
        }
    return clean


def _set_path(fields: dict[str, Any], path: str, value: Any, where: str) -> None:
    """Set ``fields[path]``; ``events.<i>.<param>`` reaches into a hazard."""
    parts = path.split(".")
    if parts[0] not in SCENARIO_KEYS:
        raise ScenarioError(f"{where}: {parts[0]!r} is not a scenario field")
    if len(parts) == 1:
        fields[path] = value
        return
    if parts[0] != "events" or len(parts) != 3 or not parts[1].isdigit():
        raise ScenarioError(f"{where}: only events.<index>.<parameter> paths are supported")
    events = fields.get("events") or []
    index = int(parts[1])
    if index >= len(events) or not isinstance(events[index], dict):
        raise ScenarioError(f"{where}: the scenario has no events[{index}]")
    events[index][parts[2]] = value


def _slug(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return re.sub(r"[^a-z0-9.]+", "_", text.lower()).strip("_") or "x"


# ---------------------------------------------------------------------------- as an episode
def to_scripted(event: Mapping[str, Any]) -> ScriptedEvent:
    """A validated event mapping as the fleet's scripted hazard."""
    params = {k: v for k, v in event.items() if k != "type"}
    if event["type"] == "cut_in":
        return CutIn(**params)
    return SlowLead(**params)


def episode_for(
    scenario: Scenario,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
    seed: int | None = None,
) -> tuple[EpisodeSetup, dict[str, Any], np.random.Generator]:
    """(episode setup, the fleet config it runs under, the degradation rng) for ``scenario``,
    run with ``seed`` (default: the scenario's own; see :func:`scenario_seeds`).

    Traffic level, target speeds, duration and harsher degradations become overrides of the
    fleet configuration for this one episode; the deployed file is never modified.
    """
    traffic = ScenarioSettings.load(config).traffic
    fleet_cfg = fleet_config(fleet)
    road = fleet_cfg["simulation"]["road_types"][scenario.road_type]
    env_overrides = dict(traffic[scenario.road_type][scenario.traffic] or {})
    if "duration" in (road.get("env_config") or {}):
        env_overrides["duration"] = scenario.duration_s
    road_overrides: dict[str, Any] = {"env_config": env_overrides}
    if scenario.target_speeds_mps is not None:
        road_overrides["target_speeds_mps"] = list(scenario.target_speeds_mps)
    episode_cfg = with_overrides(
        fleet_cfg,
        {
            "simulation": {"road_types": {scenario.road_type: road_overrides}},
            "degradation": scenario.degradation,
        },
    )
    rate_hz = float(episode_cfg["simulation"]["policy_frequency_hz"])
    seed = scenario.seed if seed is None else int(seed)
    setup = EpisodeSetup(
        road_type=scenario.road_type,
        weather=scenario.weather,
        lighting=scenario.lighting,
        env_seed=seed,
        max_steps=round(scenario.duration_s * rate_hz),
        events=tuple(to_scripted(e) for e in scenario.events),
    )
    rng = np.random.default_rng(np.random.SeedSequence([seed, _DEGRADATION_STREAM]))
    return setup, episode_cfg, rng
