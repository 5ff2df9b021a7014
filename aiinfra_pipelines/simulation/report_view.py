"""A regression report as people read it: a flat table per scenario (Dagster metadata) and
Markdown (the run's description and the certificate's attachment).

Kept apart from the simulation and aggregation in :mod:`.regression`, which decide the verdict;
nothing here changes a figure, it only lays the report out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .roles import ROLE_CANDIDATE, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION, ROLES


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


TABLE_COLUMNS = (
    ("scenario", "scenario_id"),
    ("slice", "slice"),
    ("status", "status"),
)
# Per engine and scenario, over its seeds.
ENGINE_COLUMNS = (
    ("pass rate", "pass_rate"),
    ("at-fault", "at_fault_collisions"),
    ("collisions", "collisions"),
    ("progress m", "mean_progress_m"),
    ("min TTC s", "min_ttc_s"),
    ("fallbacks", "fallback_activations"),
    ("planner p95 ms", "planner_p95_ms"),
    ("engine p95 ms", "perception_p95_ms"),
    ("degradations", "degradation_transition_count"),
)
ROLE_TITLES = {
    ROLE_CANDIDATE: "cand.",
    ROLE_PRODUCTION: "prod.",
    ROLE_ORACLE: "oracle",
    ROLE_MODEL_ZERO: "model 0",
}


def report_table_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per scenario) for a metadata table: the candidate's columns, production's
    pass rate / at-fault / collisions / progress, and the oracle's and model zero's pass rate
    and at-fault count."""
    table = []
    for row in report["scenarios"]:
        flat: dict[str, Any] = {title: row[key] for title, key in TABLE_COLUMNS}
        for role, columns in (
            (ROLE_CANDIDATE, ENGINE_COLUMNS),
            (ROLE_PRODUCTION, ENGINE_COLUMNS[:4]),
            (ROLE_ORACLE, ENGINE_COLUMNS[:2]),
            (ROLE_MODEL_ZERO, ENGINE_COLUMNS[:2]),
        ):
            summary = row.get(role) or {}
            for title, key in columns:
                flat[f"{ROLE_TITLES[role]} {title}"] = summary.get(key)
        table.append(flat)
    return table


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: verdict, failures, at-fault counts of all four planners, slice
    rates, scenario table."""
    lines = [
        *_verdict_lines(report),
        *_failure_lines(report),
        *_slice_lines(report["slices"]),
        *_scenario_lines(report_table_rows(report)),
    ]
    return "\n".join(lines) + "\n"


def _verdict_lines(report: Mapping[str, Any]) -> list[str]:
    aggregate = report["aggregate"]
    lines = [
        f"## Regression simulation — model version {report['model_version']}: "
        + ("**PASSED**" if report["passed"] else "**REFUSED**"),
        "",
        f"candidate engine `{str(report['candidate']['engine_sha256'])[:12]}` vs production "
        f"{report['production']['model_version']} "
        f"(`{str(report['production']['engine_sha256'])[:12]}`), library version "
        f"{report['library_version']}, {aggregate['scenarios']} scenarios x "
        f"{aggregate['seeds_per_scenario']} seeds = {aggregate['episodes']} episodes per "
        f"planner, {report['shards']} shard(s).",
        "",
        "| planner | at-fault collisions | all collisions | scenarios passed | mean pass rate |",
        "| --- | --- | --- | --- | --- |",
    ]
    for role in ROLES:
        lines.append(
            f"| {role} | {_fmt(aggregate.get(f'{role}_at_fault'))} | "
            f"{_fmt(aggregate.get(f'{role}_collisions'))} | "
            f"{_fmt(aggregate.get(f'{role}_passed'))} | "
            f"{_fmt(aggregate.get(f'{role}_mean_pass_rate'), 2)} |"
        )
    limit = (
        f"first release: limit {aggregate['at_fault_rate_budget']:.3f}, "
        f"{aggregate.get('at_fault_rate_limit_from') or 'absolute'}"
        if aggregate.get("first_release")
        else f"budget +{aggregate['at_fault_rate_budget']:.3f}"
    )
    return [
        *lines,
        "",
        f"at-fault collision rate per episode: candidate "
        f"{aggregate['candidate_at_fault_rate']:.3f}, production "
        f"{aggregate['production_at_fault_rate']:.3f} ({limit}).",
    ]


def _failure_lines(report: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    if report["failures"]:
        lines += ["", "### Gate failures", *(f"- {failure}" for failure in report["failures"])]
    within_chance = report["aggregate"].get("within_chance")
    if within_chance:
        lines += [
            "",
            "Worse than production by the thresholds but within chance on the pooled seeds "
            "(gates.yaml regression_significance): " + ", ".join(str(s) for s in within_chance),
        ]
    return lines


def _slice_lines(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Slices",
        "",
        "| slice | scenarios | cand. at-fault | prod. at-fault | oracle at-fault |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in slices:
        lines.append(
            f"| {s['slice']} | {s['scenarios']} | {s['candidate_at_fault']} | "
            f"{s['production_at_fault']} | {_fmt(s.get('oracle_at_fault'))} |"
        )
    return lines


def _scenario_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    headers = list(rows[0])
    lines = ["", "### Scenarios", "", "| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row[h], 2) for h in headers) + " |")
    return lines
