"""Where regression outcomes live in the lake, and the per-engine outcome cache.

``simulation/results/<engine>/<scenario id>/<scenario version>/seed-<seed>.json`` holds one
engine's outcome on one scenario definition run with one seed; ``<engine>`` is the ONNX sha256,
or ``ground-truth`` for the oracle. Production, the oracle and model zero rarely change, so their
outcomes are reused cycle after cycle instead of being re-simulated (and a candidate's outcomes
serve again once it is released); a record is valid only under the simulator
fingerprint it was made with (simulator version, fleet and metric configuration), so a changed
planner or physics setting recomputes instead of serving stale results.

``simulation/regression/shards/<shard>.json`` is a shard's latest regression result — the
current value of one ``regression_simulation`` partition, published to ``main`` so the report
run (a different run, maybe another pod) can read every shard.
"""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.lake.port import VersionedLake

from .scenarios import Scenario

RESULTS_PREFIX = "simulation/results/"
SHARDS_PREFIX = "simulation/regression/shards/"


def result_key(engine: str, scenario: Scenario, seed: int) -> str:
    return f"{RESULTS_PREFIX}{engine}/{scenario.id}/{scenario.version}/seed-{int(seed)}.json"


def shard_result_key(shard_key: str) -> str:
    return f"{SHARDS_PREFIX}{shard_key}.json"


def outcome_record(
    engine_name: str,
    engine: str,
    scenario: Scenario,
    seed: int,
    fingerprint: str,
    metrics: dict,
) -> dict[str, Any]:
    return {
        "engine_name": engine_name,
        "engine": engine,
        "scenario_id": scenario.id,
        "scenario_version": scenario.version,
        "seed": int(seed),
        "simulator_fingerprint": fingerprint,
        "metrics": metrics,
    }


def cached_metrics(
    lake: VersionedLake, ref: str, engine: str, scenario: Scenario, seed: int, fingerprint: str
) -> dict[str, Any] | None:
    """The recorded metrics of this engine on this scenario version and seed, if still valid."""
    key = result_key(engine, scenario, seed)
    record = lake.get_json_or_none(ref, key)
    if record is None or record.get("simulator_fingerprint") != fingerprint:
        return None
    return record["metrics"]
