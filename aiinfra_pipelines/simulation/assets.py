"""Simulation assets (group ``simulation``): scenario library, sharded regression, report.

* ``scenario_library`` — base scenarios from ``resources/scenarios/`` plus one regression
  scenario per mined-badcase / fleet-failure log on ``main``; published to
  ``simulation/scenarios/library.json`` by write–audit–publish, never dropping a scenario.
* ``regression_simulation`` — static partitions = shards; each run simulates its shard's
  scenarios, each over the configured seeds, with the candidate's ship engine, the production
  engine, the oracle (ground-truth perception) and model zero (cached outcomes reused, an
  engine in two roles simulated once) in worker processes and publishes the shard's record.
* ``regression_report`` — aggregates every shard (refusing shards of different candidates),
  applies the gate, publishes ``candidates/<v>/reports/regression_simulation.json`` with the
  library's updated first-failed / first-fixed records, logs the report to the candidate's
  MLflow run; its metadata carries the at-fault collision counts of all four planners
  (``candidate_at_fault``, ``production_at_fault``, ``oracle_at_fault``, ``model_zero_at_fault``)
  and ``scenarios``. Its check ``regression_no_new_failures`` re-runs the gate on the published
  report; it does not block — certification re-verifies and names every failed gate.

Runs are started by ``regression_simulation_sensor`` (library → shards → report) with the
candidate's model version in the run config, so every shard simulates the same candidate.
"""

import hashlib
import json
from typing import Any

import dagster as dg

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.ingest.assets import published_ingest
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, publish_objects, root_run_id_of
from aiinfra_pipelines.mining.assets import published_mining
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION
from aiinfra_pipelines.training.resources import MlflowTracking, mlflow_tracking_uri

from .candidate import CandidateError, latest_candidate_version, load_candidate, report_key
from .from_fleet import fleet_regression_scenarios
from .gate import evaluate_gate
from .library import LIBRARY_KEY, merge_library, record_results, records_by_id, shard_keys
from .regression import (
    HEADLINE_KEYS,
    aggregate_shards,
    build_report,
    read_library,
    read_shards,
    report_markdown,
    report_outcomes,
    report_table_rows,
    run_shard,
    shard_objects,
)
from .roles import ROLE_CANDIDATE, ROLES
from .scenarios import load_base_scenarios
from .settings import shard_count

GROUP = "simulation"
CHECK_NAME = "regression_no_new_failures"
# The deployment layer's asset that publishes the candidate manifest (referenced by key).
PUBLISHED_ENGINE = dg.AssetKey("published_engine")

# Shard count from simulation.yaml when the code location loads; changing it re-shards the
# library (assignment is by hash of scenario id modulo the count).
shard_partitions = dg.StaticPartitionsDefinition(shard_keys(shard_count()))


def shard_partition_keys() -> list[str]:
    return shard_partitions.get_partition_keys()


class RegressionConfig(dg.Config):
    """Which candidate to simulate; empty = the newest published one (``candidates/latest.json``).

    The sensor always sets it, so every shard and the report of one cycle agree.
    """

    model_version: str = ""


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=str).encode()


def _table(rows: list[dict[str, Any]]) -> dg.TableMetadataValue:
    columns = []
    for name in rows[0] if rows else []:
        values = [row[name] for row in rows if row[name] is not None]
        kind = (
            "bool"
            if values and all(isinstance(v, bool) for v in values)
            else "float"
            if values and all(isinstance(v, int | float) for v in values)
            else "string"
        )
        columns.append(dg.TableColumn(name, kind))
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {k: (v if isinstance(v, str | int | float | bool) else None) for k, v in r.items()}
            )
            for r in rows
        ],
        schema=dg.TableSchema(columns=columns),
    )


@dg.asset(group_name=GROUP, kinds={"lakefs", "yaml"}, deps=[published_ingest, published_mining])
def scenario_library(
    context: dg.AssetExecutionContext, lake: VersionedLake
) -> dg.MaterializeResult:
    """Every regression scenario: base families plus one per badcase / fleet-failure log.

    Grows monotonically: a new version is the previous one plus new and revised scenarios;
    scenarios whose source disappeared stay (``orphaned``), never dropped.
    """
    base = load_base_scenarios()
    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    index = scene_index_view(lake)
    previous = (
        lake.get_json(MAIN_BRANCH, LIBRARY_KEY)
        if lake.object_exists(MAIN_BRANCH, LIBRARY_KEY)
        else None
    )
    in_library = frozenset(entry["id"] for entry in (previous or {}).get("scenarios", []))
    regression = fleet_regression_scenarios(badcases, index, in_library=in_library)
    candidate = latest_candidate_version(lake)
    source_commit = lake.resolve_ref(MAIN_BRANCH)
    library, change = merge_library(
        previous,
        [*base, *regression],
        built_from={"main_commit": source_commit, "refreshed_for_model_version": candidate or ""},
    )
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {LIBRARY_KEY: _json(library)},
        f"scenario library v{library['library_version']}",
        {
            "kind": "scenario_library",
            "library_version": str(library["library_version"]),
            "dagster_run_id": context.run.run_id,
        },
    )
    kinds: dict[str, int] = {}
    for entry in library["scenarios"]:
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0) + 1
    return dg.MaterializeResult(
        metadata={
            "library_version": library["library_version"],
            "scenarios": len(library["scenarios"]),
            "by_kind": dg.MetadataValue.json(kinds),
            "added": dg.MetadataValue.json(change.added),
            "revised": dg.MetadataValue.json(change.revised),
            "orphaned": dg.MetadataValue.json(change.orphaned),
            "refreshed_for_model_version": candidate or "none",
            "commit": commit,
        }
    )


@dg.asset(
    partitions_def=shard_partitions,
    group_name=GROUP,
    kinds={"onnx", "lakefs"},
    deps=[scenario_library, PUBLISHED_ENGINE],
)
def regression_simulation(
    context: dg.AssetExecutionContext, config: RegressionConfig, lake: VersionedLake
) -> dg.MaterializeResult:
    """One shard: candidate, production, oracle and model zero, closed loop, every scenario and
    seed."""
    run = run_shard(
        lake,
        context.partition_key,
        shards=len(shard_partition_keys()),
        model_version=config.model_version or None,
        on_progress=context.log.info,
    )
    record = run.record
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        shard_objects(run),
        f"regression simulation {record['shard']} for model version {record['model_version']}",
        {
            "kind": "regression_simulation",
            "model_version": str(record["model_version"]),
            "shard": record["shard"],
            "dagster_run_id": context.run.run_id,
        },
    )
    rows = [
        {
            "scenario": row["scenario_id"],
            "slice": row["slice"],
            "seeds": len(row["seeds"]),
            **{
                f"{role} collisions": sum(bool(e["collision"]) for e in row[role]) for role in ROLES
            },
            **{
                f"{role} at-fault": sum(bool(e.get("at_fault_collision")) for e in row[role])
                for role in ROLES
            },
            "cand. fallbacks": sum(e["fallback_activations"] for e in row[ROLE_CANDIDATE]),
            "cached": ",".join(role for role, hit in sorted(row["cached"].items()) if hit),
        }
        for row in record["scenarios"]
    ]
    return dg.MaterializeResult(
        metadata={
            "model_version": str(record["model_version"]),
            "candidate_engine_sha256": record["candidate_engine_sha256"],
            "production": record["production_version"],
            "library_version": record["library_version"],
            "scenarios": len(record["scenarios"]),
            "seeds_per_scenario": record["seeds_per_scenario"],
            "simulated_runs": run.simulated,
            "reused_runs": run.reused,
            "outcomes": _table(rows) if rows else dg.MetadataValue.text("no scenarios"),
            "commit": commit,
        }
    )


@dg.asset(
    group_name=GROUP,
    kinds={"mlflow", "lakefs"},
    deps=[regression_simulation],
)
def regression_report(
    context: dg.AssetExecutionContext,
    config: RegressionConfig,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
) -> dg.MaterializeResult:
    """All shards of one candidate, the regression gate's verdict, and the library's records."""
    import mlflow

    keys = shard_partition_keys()
    shards = len(keys)
    identity, rows = aggregate_shards(
        read_shards(lake, keys), model_version=config.model_version or None
    )
    version = str(identity["model_version"])
    candidate = load_candidate(lake, version)
    if candidate.engine.sha256 != identity["candidate_engine_sha256"]:
        raise CandidateError(
            f"candidate {version}'s ship engine changed since its shards were simulated "
            f"({identity['candidate_engine_sha256'][:12]} → {candidate.engine.sha256[:12]})"
        )
    if not candidate.mlflow_run_id:
        raise CandidateError(f"candidate {version}: manifest has no mlflow_run_id")
    library = read_library(lake)
    gates = load_resource_yaml("gates.yaml")
    gate = evaluate_gate(
        rows,
        records_by_id(library),
        gates,
        first_release=str(identity["production_version"]) == BOOTSTRAP_VERSION,
        production_version=str(identity["production_version"]),
    )
    report = build_report(
        identity, rows, gate, shards=shards, gates_version=str(gates.get("version", ""))
    )
    library, record_changes = record_results(
        library,
        gate.comparisons,
        candidate_version=version,
        production_version=str(identity["production_version"]),
        candidate_accepted=gate.passed,
    )
    markdown = report_markdown(report)
    report_bytes = _json(report)
    with (
        mlflow_tracking_uri(mlflow_tracking.uri()),
        mlflow.start_run(run_id=candidate.mlflow_run_id),
    ):
        mlflow.log_text(markdown, "regression_simulation/report.md")
        mlflow.log_text(report_bytes.decode(), "regression_simulation/report.json")
        aggregate = report["aggregate"]
        figures = {
            f"sim_{role}_{name}": aggregate[f"{role}_{name}"]
            for role in ROLES
            for name in ("at_fault", "at_fault_rate", "collisions", "passed")
            if aggregate.get(f"{role}_{name}") is not None
        }
        mlflow.log_metrics({**figures, "sim_passed": float(report["passed"])})
    key = report_key(version)
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {key: report_bytes, LIBRARY_KEY: _json(library)},
        f"regression simulation report for model version {version}: "
        + ("passed" if report["passed"] else "refused"),
        {
            "kind": "regression_report",
            "model_version": version,
            "passed": str(report["passed"]).lower(),
            "dagster_run_id": context.run.run_id,
        },
    )
    return dg.MaterializeResult(
        metadata={
            "model_version": version,
            "passed": report["passed"],
            "failures": dg.MetadataValue.json(report["failures"]),
            "report_key": key,
            "report_sha256": hashlib.sha256(report_bytes).hexdigest(),
            "commit": commit,
            "record_changes": dg.MetadataValue.json(record_changes),
            **{
                key: value
                for key, value in report["summary"].items()
                if key in HEADLINE_KEYS and value is not None
            },
            "report": dg.MetadataValue.md(markdown),
            "scenario_table": _table(report_table_rows(report)),
        }
    )


@dg.asset_check(asset=regression_report, name=CHECK_NAME, blocking=False)
def regression_no_new_failures(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake
) -> dg.AssetCheckResult:
    """Re-runs the gate on the published report: no scenario production passes may fail for the
    candidate, no pass rate drops beyond tolerance, fixed scenarios stay fixed, at-fault
    collision rates (total, per slice) within budget."""
    event = context.instance.get_latest_materialization_event(regression_report.key)
    if event is None or event.asset_materialization is None:
        return dg.AssetCheckResult(passed=False, metadata={"reason": "no report materialized"})
    metadata = event.asset_materialization.metadata
    commit = metadata["commit"].value
    key = metadata["report_key"].value
    report = lake.get_json(commit, key)
    outcomes, records = report_outcomes(report)
    gate = evaluate_gate(
        outcomes,
        records,
        load_resource_yaml("gates.yaml"),
        first_release=bool(report["aggregate"].get("first_release")),
        production_version=str(report["production"]["model_version"]),
    )
    return dg.AssetCheckResult(
        passed=gate.passed,
        metadata={
            "model_version": str(report["model_version"]),
            "failures": dg.MetadataValue.json(gate.failures),
            "new_failures": dg.MetadataValue.json(
                [c.scenario_id for c in gate.comparisons if c.status == "new_failure"]
            ),
            "at_fault_rates": dg.MetadataValue.json(gate.aggregate),
            "report_verdict_matches": gate.passed == bool(report["passed"]),
        },
    )
