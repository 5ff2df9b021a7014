"""The regression gate's verdict on one candidate, from every shard of its simulation.

What ``regression_report`` computes, without Dagster around it: the shards aggregated (refusing
shards of different candidates), the candidate re-verified (its ship engine must still be the
one the shards drove), the gate applied and the library's first-failed / first-fixed records
updated. Publishing and MLflow logging stay with the asset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.perception.deployed import BOOTSTRAP_VERSION
from aiinfra_pipelines.training.resources import mlflow_tracking_uri

from .candidate import Candidate, CandidateError, load_candidate
from .gate import evaluate_gate
from .gate_settings import SimulationGate
from .gate_verdicts import gate_section
from .library import record_results, records_by_id
from .regression import aggregate_shards, build_report, read_library, read_shards
from .roles import ROLES


@dataclass(frozen=True)
class RegressionVerdict:
    """The gate's report on one candidate and the library as that verdict leaves it."""

    model_version: str
    mlflow_run_id: str
    report: dict[str, Any]
    library: dict[str, Any]
    record_changes: Any

    @property
    def passed(self) -> bool:
        return bool(self.report["passed"])


def verified_candidate(lake: VersionedLake, identity: Mapping[str, Any]) -> Candidate:
    """The candidate the shards simulated, refused if its ship engine changed since or it has
    no MLflow run to log the report to."""
    version = str(identity["model_version"])
    candidate = load_candidate(lake, version)
    if candidate.engine.sha256 != identity["candidate_engine_sha256"]:
        raise CandidateError(
            f"candidate {version}'s ship engine changed since its shards were simulated "
            f"({identity['candidate_engine_sha256'][:12]} → {candidate.engine.sha256[:12]})"
        )
    if not candidate.mlflow_run_id:
        raise CandidateError(f"candidate {version}: manifest has no mlflow_run_id")
    return candidate


def judge_regression(
    lake: VersionedLake, shard_keys: Sequence[str], model_version: str | None
) -> RegressionVerdict:
    """Aggregate every shard of ``model_version`` (default: the one they agree on) and gate it."""
    identity, rows = aggregate_shards(read_shards(lake, shard_keys), model_version=model_version)
    version = str(identity["model_version"])
    candidate = verified_candidate(lake, identity)
    library = read_library(lake)
    gates = load_resource_yaml("gates.yaml")
    production = str(identity["production_version"])
    gate = evaluate_gate(
        rows,
        records_by_id(library),
        gates,
        first_release=production == BOOTSTRAP_VERSION,
        production_version=production,
    )
    report = build_report(identity, rows, gate, shards=len(shard_keys), rules=gate_rules(gates))
    library, record_changes = record_results(
        library,
        gate.comparisons,
        candidate_version=version,
        production_version=production,
        candidate_accepted=gate.passed,
        candidate_engine_sha256=candidate.engine.sha256,
        fix_alpha=SimulationGate.from_section(gate_section(gates)).levels.fix_alpha,
    )
    return RegressionVerdict(
        model_version=version,
        mlflow_run_id=str(candidate.mlflow_run_id),
        report=report,
        library=library,
        record_changes=record_changes,
    )


def log_verdict(tracking_uri: str, verdict: RegressionVerdict, markdown: str, data: bytes) -> None:
    """The report (markdown and JSON) and its headline figures on the candidate's MLflow run."""
    import mlflow

    with mlflow_tracking_uri(tracking_uri), mlflow.start_run(run_id=verdict.mlflow_run_id):
        mlflow.log_text(markdown, "regression_simulation/report.md")
        mlflow.log_text(data.decode(), "regression_simulation/report.json")
        aggregate = verdict.report["aggregate"]
        figures = {
            f"sim_{role}_{name}": aggregate[f"{role}_{name}"]
            for role in ROLES
            for name in ("at_fault", "at_fault_rate", "collisions", "passed")
            if aggregate.get(f"{role}_{name}") is not None
        }
        mlflow.log_metrics({**figures, "sim_passed": float(verdict.report["passed"])})
