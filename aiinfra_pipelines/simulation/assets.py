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

import dagster as dg

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.curation.similarity_requests import (
    latest_more_like_this,
    scenario_candidate_logs,
)
from aiinfra_pipelines.curation.similarity_settings import SimilaritySettings
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.ingest.assets import published_ingest
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.mining.assets import published_mining
from aiinfra_pipelines.training.resources import MlflowTracking

from .candidate import latest_candidate_version, report_key
from .from_fleet import fleet_regression_scenarios
from .gate import evaluate_gate
from .gate_settings import SimulationGate
from .gate_verdicts import gate_section
from .library import LIBRARY_KEY, merge_library, shard_keys
from .metadata import report_metadata, shard_outcome_rows, table_metadata
from .regression import report_outcomes
from .report_view import report_markdown
from .scenarios import load_base_scenarios
from .settings import ExecutionSettings
from .shard import run_shard, shard_objects
from .verdict import judge_regression, log_verdict

GROUP = "simulation"
CHECK_NAME = "regression_no_new_failures"
# The deployment layer's asset that publishes the candidate manifest (referenced by key).
PUBLISHED_ENGINE = dg.AssetKey("published_engine")

# Shard count from simulation.yaml when the code location loads; changing it re-shards the
# library (assignment is by hash of scenario id modulo the count).
shard_partitions = dg.StaticPartitionsDefinition(shard_keys(ExecutionSettings.load().shards))


def shard_partition_keys() -> list[str]:
    return shard_partitions.get_partition_keys()


class RegressionConfig(dg.Config):
    """Which candidate to simulate; empty = the newest published one (``candidates/latest.json``).

    The sensor always sets it, so every shard and the report of one cycle agree.
    """

    model_version: str = ""


class ShardConfig(RegressionConfig):
    """A shard's candidate and the commit its scenario library is read at (empty = ``main``):
    the sensor pins the library it saw refreshed for the candidate, so a shard simulates that
    library whenever its run starts."""

    library_commit: str = ""


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
    previous = lake.get_json_or_none(MAIN_BRANCH, LIBRARY_KEY)
    in_library = frozenset(entry["id"] for entry in (previous or {}).get("scenarios", []))
    similar = scenario_candidate_logs(
        latest_more_like_this(lake), SimilaritySettings.load().scenario_max_logs
    )
    regression = fleet_regression_scenarios(badcases, index, in_library=in_library, similar=similar)
    candidate = latest_candidate_version(lake)
    source_commit = lake.resolve_ref(MAIN_BRANCH)
    library, change = merge_library(
        previous,
        [*base, *regression],
        built_from={"main_commit": source_commit, "refreshed_for_model_version": candidate or ""},
        seed_count=SimulationGate.from_section(gate_section()).evidence.max_seeds,
    )
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {LIBRARY_KEY: json_document(library)},
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
            "more_like_this_logs": dg.MetadataValue.json(similar["log_id"].tolist()),
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
    context: dg.AssetExecutionContext, config: ShardConfig, lake: VersionedLake
) -> dg.MaterializeResult:
    """One shard: candidate, production, oracle and model zero, closed loop, every scenario and
    seed."""
    run = run_shard(
        lake,
        context.partition_key,
        shards=len(shard_partition_keys()),
        model_version=config.model_version or None,
        library_ref=config.library_commit or MAIN_BRANCH,
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
    rows = shard_outcome_rows(record)
    return dg.MaterializeResult(
        metadata={
            "model_version": str(record["model_version"]),
            "candidate_engine_sha256": record["candidate_engine_sha256"],
            "production": record["production_version"],
            "library_version": record["library_version"],
            "scenarios": len(record["scenarios"]),
            "seed_stages": dg.MetadataValue.json(record["seed_stages"]),
            "episodes": sum(len(row["candidate"]) for row in record["scenarios"]),
            "simulated_runs": run.simulated,
            "reused_runs": run.reused,
            "outcomes": table_metadata(rows) if rows else dg.MetadataValue.text("no scenarios"),
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
    verdict = judge_regression(lake, shard_partition_keys(), config.model_version or None)
    version = verdict.model_version
    markdown = report_markdown(verdict.report)
    report_bytes = json_document(verdict.report)
    log_verdict(mlflow_tracking.uri(), verdict, markdown, report_bytes)
    key = report_key(version)
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {key: report_bytes, LIBRARY_KEY: json_document(verdict.library)},
        f"regression simulation report for model version {version}: "
        + ("passed" if verdict.passed else "refused"),
        {
            "kind": "regression_report",
            "model_version": version,
            "passed": str(verdict.passed).lower(),
            "dagster_run_id": context.run.run_id,
        },
    )
    sha256 = hashlib.sha256(report_bytes).hexdigest()
    return dg.MaterializeResult(
        metadata=report_metadata(
            verdict.report, markdown, verdict.record_changes, key, sha256, commit
        )
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
    gates = load_resource_yaml("gates.yaml")
    gate = evaluate_gate(
        outcomes,
        records,
        gates,
        first_release=bool(report["aggregate"].get("first_release")),
        production_version=str(report["production"]["model_version"]),
    )
    return dg.AssetCheckResult(
        passed=gate.passed,
        metadata={
            "model_version": str(report["model_version"]),
            "failures": dg.MetadataValue.json(gate.failures),
            "regressed_scenarios": dg.MetadataValue.json(
                sorted({str(t["scenario_id"]) for t in gate.tests if t["regressed"]})
            ),
            "at_fault_rates": dg.MetadataValue.json(gate.aggregate),
            "report_verdict_matches": gate.passed == bool(report["passed"]),
            "gates_sha256_matches": report.get("gates_sha256") == gate_rules(gates).sha256,
        },
    )
