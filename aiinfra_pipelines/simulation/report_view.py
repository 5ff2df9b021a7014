"""A regression report as people read it: a flat table per scenario (Dagster metadata) and
Markdown (the run's description and the certificate's attachment).

Kept apart from the simulation and aggregation in :mod:`.regression`, which decide the verdict;
nothing here changes a figure, it only lays the report out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .roles import ROLE_CANDIDATE, ROLE_MODEL_ZERO, ROLE_ORACLE, ROLE_PRODUCTION, ROLES


def escape_markdown(text: str) -> str:
    """Text a Markdown table shows as written (``day/*/*`` is no emphasis, ``|`` no cell)."""
    return "".join(f"\\{ch}" if ch in "\\`*_[]|<>" else ch for ch in str(text))


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
    ("decision", "decision"),
    ("status (pass rates)", "status"),
    ("seeds", "seeds"),
)
# Per engine and scenario, over its seeds.
ENGINE_COLUMNS = (
    ("pass rate", "pass_rate"),
    ("at-fault", "at_fault_collisions"),
    ("collisions", "collisions"),
    ("progress m", "mean_progress_m"),
    ("min TTC s", "min_ttc_s"),
    ("fallbacks", "fallback_activations"),
    ("degradations", "degradation_transition_count"),
)
ROLE_TITLES = {
    ROLE_CANDIDATE: "cand.",
    ROLE_PRODUCTION: "prod.",
    ROLE_ORACLE: "oracle",
    ROLE_MODEL_ZERO: "model 0",
}


def report_table_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per scenario) for a metadata table: the gate's decision and the paired
    test that decided it, the candidate's columns, production's pass rate / at-fault /
    collisions / progress, and the oracle's and model zero's pass rate and at-fault count."""
    table = []
    for row in report["scenarios"]:
        flat: dict[str, Any] = {title: row.get(key) for title, key in TABLE_COLUMNS}
        tests = row.get("tests") or []
        decisive = min(tests, key=lambda t: t["p_value"], default=None)
        flat["held to"] = (
            f"{decisive['reference']} {decisive['reference_version']}" if decisive else "–"
        )
        flat["worse / better / pairs"] = (
            f"{decisive['worse']} / {decisive['better']} / {decisive['pairs']}" if decisive else "–"
        )
        flat["p (Holm level)"] = (
            f"{decisive['p_value']:.2g} ({decisive['holm_level']:.2g})" if decisive else "–"
        )
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
        f"{report['library_version']}, {aggregate['scenarios']} scenarios; seeds in stages "
        f"{aggregate.get('seed_stages')}: every planner drove the first "
        f"{aggregate['seeds_per_scenario']} of every scenario, "
        f"{aggregate.get('confirmed_scenarios', 0)} scenario(s) in doubt ran more (mean "
        f"{aggregate.get('mean_seeds')} seeds per scenario); {report['shards']} shard(s). "
        f"Rules: gates.yaml {report.get('gates_version')} "
        f"`{str(report.get('gates_sha256') or '')[:12]}`.",
        "",
        "At-fault collisions on the first stage of seeds (every planner, same seeds):",
        "",
        "| planner | at-fault | rate (90 % interval) | all collisions | scenarios passed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for role in ROLES:
        bounds = aggregate.get(f"{role}_at_fault_rate_bounds")
        rate = aggregate.get(f"{role}_at_fault_rate")
        interval = (
            f"{rate:.3f} ({bounds[0]:.3f}–{bounds[1]:.3f})" if bounds and rate is not None else "–"
        )
        lines.append(
            f"| {role} | {_fmt(aggregate.get(f'{role}_at_fault'))} | {interval} | "
            f"{_fmt(aggregate.get(f'{role}_collisions'))} | "
            f"{_fmt(aggregate.get(f'{role}_passed'))} |"
        )
    return [*lines, "", *_rule_lines(aggregate)]


def verdict_explained(report: Mapping[str, Any]) -> str:
    """The verdict in words, with the rule that decided it: shown beside the scenario table,
    whose per-scenario status (pass rate) is reported, not gated."""
    aggregate = report["aggregate"]
    word = "PASSED" if report["passed"] else "REFUSED"
    if aggregate.get("first_release"):
        how = (
            "a first release is judged against the oracle on the whole library (production is "
            "model zero, which no car runs), not scenario by scenario against production: "
            "new_failure rows in the scenario table are reported, not gated."
        )
    else:
        how = (
            "each scenario's paired exact McNemar test against production (Holm over the "
            "library) and the library-wide and per-slice paired at-fault tests decide; the "
            "scenario table's status column (pass rate) is reported, not gated."
        )
    failures = "; ".join(str(f) for f in report.get("failures") or [])
    return " ".join(
        [
            f"{word}:",
            how,
            *_rule_lines(aggregate),
            *([f"Refused on: {failures}."] if failures else []),
        ]
    )


def _rule_lines(aggregate: Mapping[str, Any]) -> list[str]:
    """How the library-wide rule read: the first release against the oracle, else the paired
    at-fault difference against production."""
    if aggregate.get("first_release"):
        low, high = aggregate["oracle_at_fault_difference_bounds"]
        return [
            "First release (production is model zero, which no car runs): the candidate's "
            "at-fault rate minus the oracle's, paired by seed: "
            f"{aggregate['oracle_at_fault_difference']:+.3f} (90 % {low:+.3f} to {high:+.3f}); "
            f"certified only if the upper {1 - aggregate['first_release_alpha']:.0%} bound "
            f"{aggregate['first_release_upper_bound']:+.3f} is below "
            f"+{aggregate['first_release_margin']:.3f}.",
        ]
    low, high = aggregate["at_fault_difference_bounds"]
    return [
        "Library-wide at-fault rate, candidate minus production, paired by seed: "
        f"{aggregate['at_fault_difference']:+.3f} (90 % {low:+.3f} to {high:+.3f}); "
        f"{aggregate['at_fault_worse']} episodes at fault only for the candidate, "
        f"{aggregate['at_fault_better']} only for production; exact McNemar "
        f"p = {aggregate['at_fault_p']:.2g} (refused at <= {aggregate['at_fault_alpha']:.2g}).",
    ]


def _failure_lines(report: Mapping[str, Any]) -> list[str]:
    if not report["failures"]:
        return []
    return ["", "### Gate failures", *(f"- {failure}" for failure in report["failures"])]


def _slice_lines(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Slices (first stage of seeds)",
        "",
        "| slice | scenarios | cand. at-fault | prod. at-fault | oracle at-fault | p | gated |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in slices:
        p_value = s.get("at_fault_p")
        lines.append(
            f"| {escape_markdown(s['slice'])} | {s['scenarios']} | {s['candidate_at_fault']} | "
            f"{s['production_at_fault']} | {_fmt(s.get('oracle_at_fault'))} | "
            f"{'–' if p_value is None else f'{p_value:.2g}'} | {_fmt(s['gated'])} |"
        )
    return lines


def _scenario_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    headers = list(rows[0])
    lines = ["", "### Scenarios", "", "| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    for row in rows:
        lines.append("| " + " | ".join(escape_markdown(_fmt(row[h], 2)) for h in headers) + " |")
    return lines
