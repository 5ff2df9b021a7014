"""A regression report from its shards: aggregation, and the report certification reads.

:func:`aggregate_shards` refuses shards that were simulated for different candidates, engines,
library versions, evidence plans or simulator settings; :func:`build_report` turns the gate's
verdict into the report (top-level ``passed`` and ``model_version``, the four planners'
at-fault counts on the first stage of seeds, every test with its counts and p-value, one row
per scenario with every seed's metrics the gate used, the gate configuration's hash and the
calibration figures it states). The report holds nothing that depends on when or how fast it
ran: the same engines on the same library give the same report. Simulating a shard is
:mod:`.shard`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from aiinfra_pipelines.gate_rules import GateRules
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.vehicle.degradation import MINIMAL_RISK

from .gate_comparison import GateResult, ScenarioComparison
from .gate_verdicts import ScenarioResult
from .results import shard_result_key
from .roles import ROLE_FIXER, ROLES
from .shard import RegressionError, read_library, run_shard, shard_objects  # noqa: F401

REPORT_FORMAT = 3
# The shard fields that must agree before shards may be aggregated into one report.
SHARD_IDENTITY = (
    "model_version",
    "candidate_engine_sha256",
    "production_version",
    "production_engine_sha256",
    "model_zero_version",
    "model_zero_engine_sha256",
    "library_version",
    "simulator_fingerprint",
    "seed_stages",
)
# Metrics the report keeps per engine, scenario and seed (the gate needs the first nine). No
# timings: they depend on the machine and its load, and a report must be reproducible.
REPORT_METRICS = (
    "seed",
    "collision",
    "at_fault_collision",
    "collision_step",
    "min_ttc_s",
    "hard_brakes",
    "progress_m",
    "duration_s",
    "min_lead_gap_m",
    "max_abs_jerk_mps3",
    "rms_jerk_mps3",
    "fallback_activations",
    "fallback_steps",
    "mean_confidence",
    "min_confidence",
    "steps",
    "collision_type",
    "collision_fault",
    # The car's degradation state machine (vehicle.degradation): every transition with its
    # step and cause, the steps spent degraded and in minimal risk, the engine's errors.
    "degradation_transitions",
    "degraded_steps",
    "minimal_risk_steps",
    "engine_errors",
)


# ------------------------------------------------------------------------------ aggregation
def read_shards(
    lake: VersionedLake, keys: Sequence[str], ref: str = MAIN_BRANCH
) -> dict[str, dict[str, Any] | None]:
    """Every shard's latest record on ``ref`` (``None`` where a shard never ran)."""
    return {key: lake.get_json_or_none(ref, shard_result_key(key)) for key in keys}


def aggregate_shards(
    shard_records: Mapping[str, Mapping[str, Any] | None],
    *,
    model_version: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the shards' shared identity, every scenario row) — or :class:`RegressionError`.

    Refuses missing shards, shards simulated for different candidates / engines / library
    versions / simulator settings, a requested ``model_version`` other than the shards', and
    shards that do not cover the library exactly once.
    """
    missing = sorted(key for key, record in shard_records.items() if record is None)
    if missing:
        raise RegressionError(f"shard(s) not simulated yet: {missing}")
    records = {key: record for key, record in shard_records.items() if record is not None}
    identities = {
        key: {f: record.get(f) for f in SHARD_IDENTITY} for key, record in records.items()
    }
    distinct = {json.dumps(identity, sort_keys=True) for identity in identities.values()}
    if len(distinct) > 1:
        differing = [
            f
            for f in SHARD_IDENTITY
            if len({json.dumps(identity[f]) for identity in identities.values()}) > 1
        ]
        detail = "; ".join(
            f"{key}: " + ", ".join(f"{f}={identities[key][f]}" for f in differing)
            for key in sorted(identities)
        )
        raise RegressionError(
            f"refusing to aggregate shards simulated for different candidates or settings "
            f"(differing: {', '.join(differing)}) — {detail}. Re-run the stale shards."
        )
    identity = next(iter(identities.values()))
    if model_version is not None and str(identity["model_version"]) != str(model_version):
        raise RegressionError(
            f"shards were simulated for model version {identity['model_version']}, "
            f"the report was requested for {model_version}"
        )
    rows = [row for key in sorted(records) for row in records[key]["scenarios"]]
    ids = [row["scenario_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise RegressionError("a scenario appears in more than one shard")
    expected = {int(record["library_scenarios"]) for record in records.values()}
    if expected != {len(rows)}:
        raise RegressionError(
            f"shards cover {len(rows)} scenario(s), the library version had {sorted(expected)}"
        )
    return identity, rows


# ---------------------------------------------------------------------------------- report
def _episode_summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    summary = {name: metrics.get(name) for name in REPORT_METRICS}
    # Outcomes cached before the state machine existed carry no transitions: none happened.
    summary["degradation_transitions"] = [
        {key: t.get(key) for key in ("step", "from_state", "to_state", "cause")}
        for t in metrics.get("degradation_transitions") or []
    ]
    return summary


def _degradation_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Transitions of the degradation state machine over a scenario's seeds: how many, by
    cause, and how many episodes reached minimal risk."""
    transitions = [t for s in summaries for t in s["degradation_transitions"]]
    causes: dict[str, int] = {}
    for transition in transitions:
        causes[str(transition["cause"])] = causes.get(str(transition["cause"]), 0) + 1
    return {
        "degradation_transition_count": len(transitions),
        "degradation_causes": dict(sorted(causes.items())),
        "minimal_risk_episodes": sum(
            any(t["to_state"] == MINIMAL_RISK for t in s["degradation_transitions"])
            for s in summaries
        ),
    }


def _summary(episodes: Sequence[Mapping[str, Any]], result: ScenarioResult) -> dict[str, Any]:
    """One engine on one scenario: its verdict over the seeds, then every episode."""
    summaries = [_episode_summary(e) for e in episodes]

    def mean(name: str) -> float | None:
        values = [s[name] for s in summaries if s.get(name) is not None]
        return round(sum(values) / len(values), 4) if values else None

    return {
        "passed": result.passed,
        "pass_rate": result.pass_rate,
        "failures": list(result.failures),
        "at_fault_collisions": result.at_fault,
        "collisions": result.collisions,
        "mean_progress_m": mean("progress_m"),
        "min_ttc_s": min(
            (s["min_ttc_s"] for s in summaries if s.get("min_ttc_s") is not None), default=None
        ),
        "fallback_activations": sum(int(s.get("fallback_activations") or 0) for s in summaries),
        **_degradation_summary(summaries),
        "episodes": [
            {**summary, "passed": verdict.passed, "failures": list(verdict.failures)}
            for summary, verdict in zip(summaries, result.verdicts, strict=True)
        ],
    }


def comparison_rows(
    comparisons: Sequence[ScenarioComparison], tests: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """One report row per scenario: status, the gate's tests on it (counts, p-value, Holm
    level, decision) and every engine's summary with its episodes."""
    by_scenario: dict[str, list[Mapping[str, Any]]] = {}
    for test in tests:
        by_scenario.setdefault(str(test["scenario_id"]), []).append(test)
    table = []
    for c in comparisons:
        own = by_scenario.get(c.scenario_id, [])
        entry: dict[str, Any] = {
            "scenario_id": c.scenario_id,
            "slice": c.slice,
            "kind": c.kind,
            "road_type": c.road_type,
            "status": c.status,
            "decision": "regressed" if any(t["regressed"] for t in own) else "not worse",
            "first_fixed_by": c.first_fixed_by,
            "fixer_version": c.fixer_version,
            "seeds": c.candidate_verdict.episodes,
            "tests": [
                {k: v for k, v in t.items() if k not in ("scenario_id", "slice")} for t in own
            ],
        }
        for role in (*ROLES, ROLE_FIXER):
            result = c.result(role)
            entry[role] = None if result is None else _summary(getattr(c, role), result)
        table.append(entry)
    return table


# The figures a reader (and the demo summary) looks for first: at-fault counts per planner.
HEADLINE_KEYS = (
    "scenarios",
    "seeds_per_scenario",
    "confirmed_scenarios",
    "episodes",
    "candidate_at_fault",
    "production_at_fault",
    "oracle_at_fault",
    "model_zero_at_fault",
    "candidate_collisions",
    "production_collisions",
    "oracle_collisions",
    "model_zero_collisions",
    "candidate_passed",
    "production_passed",
    "oracle_passed",
    "model_zero_passed",
)


def headline(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's headline figures (``HEADLINE_KEYS``: ``scenarios`` is a count here)."""
    aggregate = report["aggregate"]
    return {key: aggregate.get(key) for key in HEADLINE_KEYS}


def build_report(
    identity: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    gate: GateResult,
    *,
    shards: int,
    rules: GateRules,
) -> dict[str, Any]:
    """The report certification reads: top-level ``passed`` / ``model_version``, the headline
    at-fault counts of all four planners, aggregate and slice figures, every test, one row
    per scenario, and the rules (gate configuration hash, calibration) it was judged under."""
    return {
        "format": REPORT_FORMAT,
        "gate": "regression_simulation",
        "model_version": str(identity["model_version"]),
        "passed": gate.passed,
        "failures": gate.failures,
        "candidate": {
            "model_version": str(identity["model_version"]),
            "engine_sha256": identity["candidate_engine_sha256"],
        },
        "production": {
            "model_version": identity["production_version"],
            "engine_sha256": identity["production_engine_sha256"],
        },
        # The release this candidate was gated against (its offline evaluation's reference;
        # the bootstrap engine's name before any release): what a rollout may supersede.
        "reference_version": identity["production_version"],
        "model_zero": {
            "model_version": identity.get("model_zero_version"),
            "engine_sha256": identity["model_zero_engine_sha256"],
        },
        "oracle": {"perception": "ground truth"},
        "library_version": identity["library_version"],
        "simulator_fingerprint": identity["simulator_fingerprint"],
        "seed_stages": identity["seed_stages"],
        "seeds_per_scenario": gate.aggregate.get("seeds_per_scenario"),
        "shards": shards,
        **rules.to_dict(),
        "summary": {key: gate.aggregate.get(key) for key in HEADLINE_KEYS},
        "aggregate": gate.aggregate,
        "slices": gate.slices,
        "tests": gate.tests,
        "scenarios": comparison_rows(gate.comparisons, gate.tests),
    }


def report_outcomes(report: Mapping[str, Any]) -> tuple[list[dict], dict[str, dict]]:
    """(outcome rows, records) reconstructed from a stored report, to re-run the gate on it:
    every role's per-seed episodes as the report kept them."""
    outcomes = []
    for row in report["scenarios"]:
        outcome = {
            "scenario_id": row["scenario_id"],
            "slice": row["slice"],
            "kind": row["kind"],
            "road_type": row["road_type"],
            **{role: (row.get(role) or {}).get("episodes") for role in (*ROLES, ROLE_FIXER)},
        }
        if row.get("fixer_version"):
            outcome["fixer_version"] = row["fixer_version"]
        outcomes.append(outcome)
    records = {
        row["scenario_id"]: {"first_fixed_by": row["first_fixed_by"]} for row in report["scenarios"]
    }
    return outcomes, records
