"""Mined badcases and fleet failures as regression scenarios: one per source drive log.

Every log with a mined badcase (``mined_badcases`` on ``main``) and every log whose scene-index
rows carry a failure flag (``event_near_collision``, ``event_takeover`` — simulation.yaml
``failure_flags``) becomes scenario ``log-<log id>``: the log's road type, weather and lighting,
the configured duration and traffic, and a seed derived from the log's content (its id and
the SHA-256 of its bytes as the car recorded them; never the lake commit that happened to land
it, whose id differs from run to run). A fleet failure on a road that supports scripted
hazards also replays a cut-in at the failure's time within the log, so the scenario stresses
what went wrong there.

Logs of the latest "more like this" result (``curation.similarity_requests``: frames an
operator asked for more of) join them as scenario candidates, kind ``badcase`` with origin
``more_like_this`` and the frame that brought them in their provenance.

A scenario reproduces the log's *conditions* deterministically, not its exact traffic: a log
carries no simulator seed (a real fleet's logs have none), so the derived seed stands in for
it. Provenance (log id, commit, badcase reasons, failure flags, the engine that mined it) is
kept in ``source`` and never changes the scenario's version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.fleet.settings import FleetConfig

from .scenarios import (
    KIND_BADCASE,
    KIND_FLEET_FAILURE,
    Scenario,
    build_scenario,
    derived_seed,
)
from .settings import RegressionScenarioSettings, ScenarioSettings

SCENARIO_PREFIX = "log-"
TAG_COLUMNS = ("road_type", "weather", "lighting")


def scenario_id_for_log(log_id: str) -> str:
    return f"{SCENARIO_PREFIX}{log_id}"


def fleet_regression_scenarios(
    badcases: pd.DataFrame,
    scene_index: pd.DataFrame,
    config: dict[str, Any] | None = None,
    fleet: FleetConfig | None = None,
    *,
    in_library: frozenset[str] = frozenset(),
    similar: pd.DataFrame | None = None,
) -> list[Scenario]:
    """One regression scenario per log with a badcase, a failure flag or a "more like this"
    match (``similar``: ``similarity_requests.scenario_candidate_logs`` rows), sorted by id.

    Badcases mined by an engine in ``exclude_badcases_mined_by`` (model zero, deployed before
    any release) make no scenario: the untrained network is unsure of every frame, so every
    log of the first fleet is its "badcase" — 191 of a demo cycle's 239 scenarios, seven
    minutes of simulation on 2 cores, each only the fleet's conditions under another seed.
    Badcases of a released engine, and fleet failures whoever drove, still become scenarios.

    At most ``max_per_condition`` scenarios of one kind share a definition up to the seed
    (the same road type, weather, lighting and replayed hazard): two such logs make the same
    scenario under another seed, and every scenario already runs several seeds. Scenarios
    already in the library (``in_library``) keep their place, so nothing is orphaned; new
    ones fill what is left, fleet failures' logs with the most failure frames, then badcase
    logs with the most badcase frames, first.
    """
    scenario_settings = ScenarioSettings.load(config)
    section = RegressionScenarioSettings.load(config)
    excluded = section.exclude_badcases_mined_by
    if excluded and "engine_version" in badcases.columns:
        badcases = badcases[~badcases["engine_version"].astype(str).isin(excluded)]
    flags = [flag for flag in section.failure_flags if f"event_{flag}" in scene_index.columns]
    failures = _failure_rows(scene_index, flags)
    similar = similar if similar is not None else pd.DataFrame({"log_id": []})
    log_ids = sorted(
        set(badcases["log_id"].astype(str) if "log_id" in badcases.columns else [])
        | set(failures["log_id"].astype(str))
        | set(similar["log_id"].astype(str))
    )
    sources = _FleetSources(scene_index, badcases, failures, tuple(flags), similar)
    candidates = [
        _log_candidate(log_id, sources, scenario_settings, section, config, fleet)
        for log_id in log_ids
    ]
    return _capped(candidates, in_library, section.max_per_condition)


@dataclass(frozen=True)
class _FleetSources:
    """The fleet tables a log's scenario is derived from, and the failure flags present."""

    scene_index: pd.DataFrame
    badcases: pd.DataFrame
    failures: pd.DataFrame
    flags: tuple[str, ...]
    similar: pd.DataFrame


def _log_candidate(
    log_id: str,
    sources: _FleetSources,
    scenario_settings: ScenarioSettings,
    section: RegressionScenarioSettings,
    config: dict[str, Any] | None,
    fleet: FleetConfig | None,
) -> tuple[str, int, Scenario]:
    """(scenario id, frames that made it, scenario) for one log: a fleet failure when a failure
    flag fired on it (replaying the hazard where the road supports scripted events), else a
    badcase, under the log's own conditions and a seed derived from the log."""
    index_rows = _rows(sources.scene_index, log_id)
    badcase_rows = _rows(sources.badcases, log_id)
    failure_rows = _rows(sources.failures, log_id)
    similar_rows = _rows(sources.similar, log_id)
    tags = _tags(log_id, index_rows, badcase_rows)
    commit = _first(index_rows, "source_commit")
    log_sha256 = _first(index_rows, "log_sha256")
    kind = KIND_FLEET_FAILURE if len(failure_rows) else KIND_BADCASE
    levels = scenario_settings.traffic_levels(tags["road_type"])
    fields: dict[str, Any] = {
        **tags,
        "traffic": section.traffic if section.traffic in levels else "normal",
        "duration_s": section.duration_s,
        "seed": derived_seed(log_id, log_sha256),
    }
    if (
        kind == KIND_FLEET_FAILURE
        and tags["road_type"] in scenario_settings.scripted_event_road_types
    ):
        fields["events"] = [_failure_hazard(section, failure_rows)]
    scenario_id = scenario_id_for_log(log_id)
    scenario = build_scenario(
        fields,
        scenario_id=scenario_id,
        kind=kind,
        family=kind,
        description=f"{kind.replace('_', ' ')} from drive log {log_id}",
        source={
            **_provenance(
                log_id, commit, badcase_rows, failure_rows, list(sources.flags), similar_rows
            ),
            "log_sha256": log_sha256,
        },
        where=f"regression scenario {scenario_id}",
        config=config,
        fleet=fleet,
    )
    return scenario_id, len(failure_rows) or len(badcase_rows) or len(similar_rows), scenario


def _capped(
    candidates: list[tuple[str, int, Scenario]], in_library: frozenset[str], cap: int | None
) -> list[Scenario]:
    """At most ``cap`` scenarios per (kind, definition up to the seed); library ones first."""
    groups: dict[str, list[tuple[str, int, Scenario]]] = {}
    for entry in candidates:
        groups.setdefault(_condition(entry[2]), []).append(entry)
    kept = []
    for entries in groups.values():
        entries.sort(key=lambda e: (e[0] not in in_library, -e[1], e[0]))
        held = [e for e in entries if e[0] in in_library]
        fresh = [e for e in entries if e[0] not in in_library]
        room = len(fresh) if cap is None else max(cap - len(held), 0)
        kept += [scenario for _, _, scenario in held + fresh[:room]]
    return sorted(kept, key=lambda scenario: scenario.id)


def _condition(scenario: Scenario) -> str:
    """A scenario's definition without its id, seed and provenance: what two logs share."""
    fields = {
        k: v
        for k, v in scenario.to_dict().items()
        if k not in {"id", "seed", "source", "description", "version"}
    }
    # a hazard a second later is the same hazard
    fields["events"] = [
        {k: v for k, v in dict(event).items() if k != "at_s"}
        for event in fields.get("events") or []
    ]
    return json.dumps(fields, sort_keys=True, default=str)


def _failure_rows(index: pd.DataFrame, flags: list[str]) -> pd.DataFrame:
    if index.empty or not flags:
        return pd.DataFrame({"log_id": pd.Series([], dtype=str)})
    hit = pd.Series(False, index=index.index)
    for flag in flags:
        hit |= index[f"event_{flag}"].eq(True)
    return index[hit]


def _first(rows: pd.DataFrame, column: str) -> str:
    """The log's value of an index column ("" where the index predates the column)."""
    return str(rows[column].iloc[0]) if column in rows.columns and len(rows) else ""


def _rows(table: pd.DataFrame, log_id: str) -> pd.DataFrame:
    if table.empty or "log_id" not in table.columns:
        return table.iloc[0:0]
    return table[table["log_id"].astype(str) == log_id]


def _tags(log_id: str, index_rows: pd.DataFrame, badcase_rows: pd.DataFrame) -> dict[str, str]:
    for rows in (index_rows, badcase_rows):
        if len(rows) and all(c in rows.columns for c in TAG_COLUMNS):
            first = rows.iloc[0]
            return {column: str(first[column]) for column in TAG_COLUMNS}
    raise ValueError(f"drive log {log_id}: no road_type/weather/lighting tags in index or badcases")


def _failure_hazard(
    section: RegressionScenarioSettings, failure_rows: pd.DataFrame
) -> dict[str, Any]:
    """The configured hazard at the (clamped) time of the log's first failure frame."""
    hazard = dict(section.failure_hazard)
    low = float(hazard.pop("min_at_s"))
    after = float(hazard.pop("min_after_s"))
    duration = section.duration_s
    first = (
        float(failure_rows["t_rel_s"].min())
        if "t_rel_s" in failure_rows.columns and len(failure_rows)
        else low
    )
    hazard["at_s"] = round(min(max(first, low), max(duration - after, low)), 3)
    return hazard


def _provenance(
    log_id: str,
    commit: str,
    badcase_rows: pd.DataFrame,
    failure_rows: pd.DataFrame,
    flags: list[str],
    similar_rows: pd.DataFrame,
) -> dict[str, Any]:
    reasons = sorted(
        {
            reason
            for text in badcase_rows.get("reasons", pd.Series([], dtype=str)).fillna("")
            for reason in str(text).split(",")
            if reason
        }
    )
    fired = sorted(flag for flag in flags if failure_rows.get(f"event_{flag}", pd.Series()).any())
    engines = sorted(set(badcase_rows.get("engine_version", pd.Series([], dtype=str)).astype(str)))
    origins = (["badcase"] if len(badcase_rows) else []) + (["fleet_failure"] if fired else [])
    similar_to = {}
    if len(similar_rows):
        origins.append("more_like_this")
        first = similar_rows.iloc[0]
        similar_to = {
            "similar_to": {
                "query": str(first["query"]),
                "frame": str(first["frame"]),
                "distance": float(first["distance"]),
                "request_id": str(first["request_id"]),
            }
        }
    return {
        "log_id": log_id,
        "source_commit": commit,
        "origins": origins,
        "badcase_frames": len(badcase_rows),
        "badcase_reasons": reasons,
        "failure_flags": fired,
        "failure_frames": len(failure_rows),
        "mined_by_engines": engines,
        **similar_to,
    }
