"""Candidate vs production on the same benchmark, with the offline budgets of gates.yaml.

A candidate may be better overall and still worse where it matters (night, fog), so the gate is
per slice: every slice (and condition aggregate, and ``overall``) with at least
``offline.min_slice_frames`` benchmark frames is *gated* — its regression against production
must stay within the metric's budget. Smaller slices are reported but not gated, since a
handful of frames cannot tell a regression from noise. Budgets come from ``offline.budgets``,
overridden per slice by the first ``offline.slice_overrides`` pattern (fnmatch) that matches
the slice name; an override may set only some metrics.

``regression`` is signed so that positive means worse, whatever the metric's direction:
``production - candidate`` for accuracy/F1 (higher is better), ``candidate - production`` for
MAE (lower is better). ``delta`` is always ``candidate - production``.

A budget alone is a point estimate against a threshold: on a 50-frame slice run-to-run noise
crosses a 2 m MAE budget in both directions. Given the per-frame scores of both models on the
benchmark (``evidence``, :class:`.frame_scores.PairedFrames`), a gated row fails only when its
regression exceeds the budget *and* a paired bootstrap over its frames shows it beyond chance
(``offline.significance``: Holm over every gated row and metric at ``alpha``). A first release
is judged the same way: a row fails when the candidate falls short of beating the baseline by
the margin and that shortfall is beyond chance. Without per-frame evidence (a table-only
caller) the budgets alone decide, which only ever refuses more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import pandas as pd

from aiinfra_pipelines.metadata_tables import escape_markdown
from aiinfra_pipelines.statistics.multiplicity import holm_level, holm_rejections

from .frame_scores import HIGHER_IS_BETTER, PairedFrames
from .paired_bootstrap import row_tests
from .slices import METRIC_COLUMNS

TABLE_COLUMNS: tuple[str, ...] = (
    "slice",
    "kind",
    "metric",
    "frames",
    "candidate",
    "production",
    "delta",
    "regression",
    "budget",
    "gated",
    "passed",
    "standard_error",
    "p_value",
    "level",
)
NO_PRODUCTION_NOTE = (
    "no production model yet: nothing to regress against, the candidate passes; "
    "its metrics are reported for the record"
)
FIRST_RELEASE_NOTE = (
    "no production model yet: first release, held to beating the no-camera baselines "
    "(per-cell majority occupancy, mean lead gap) by the margins of offline.first_release"
)
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Comparison:
    """The outcome of the offline gate: a long table (slice × metric) and the verdict."""

    table: pd.DataFrame
    passed: bool
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    has_production: bool = True
    # What the candidate was measured against: "production", or "baseline" on a first release.
    reference: str = "production"

    def to_markdown(self) -> str:
        """A report for Dagster metadata: verdict, failures, notes, one row per slice."""
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"**Offline gate: {verdict}**", ""]
        lines += [f"- FAIL {escape_markdown(failure)}" for failure in self.failures]
        lines += [f"- note: {escape_markdown(note)}" for note in self.notes]
        if self.failures or self.notes:
            lines.append("")
        metrics = list(dict.fromkeys(self.table["metric"])) if len(self.table) else []
        short = "base" if self.reference == "baseline" else "prod"
        header = ["slice", "frames", *(f"{m} (cand / {short} / Δ)" for m in metrics), "status"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for slice_, group in self.table.groupby("slice", sort=False):
            by_metric = {r.metric: r for r in group.itertuples(index=False)}
            cells = [escape_markdown(str(slice_)), str(int(group["frames"].iloc[0]))]
            for metric in metrics:
                r = by_metric.get(metric)
                cells.append(
                    "—"
                    if r is None
                    else f"{_fmt(r.candidate)} / {_fmt(r.production)} / {_fmt(r.delta, sign=True)}"
                )
            if not group["gated"].any():
                status = "not gated"
            else:
                status = "pass" if group["passed"].all() else "**FAIL**"
            cells.append(status)
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        """Small JSON-ready facts for asset metadata and MLflow tags."""
        return {
            "passed": self.passed,
            "has_production": self.has_production,
            "reference": self.reference,
            "failures": len(self.failures),
            "slices": int(self.table["slice"].nunique()) if len(self.table) else 0,
            "gated_slices": int(self.table.loc[self.table["gated"], "slice"].nunique())
            if len(self.table)
            else 0,
        }


def _fmt(value: float, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def offline_gates(gates: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``offline`` section, whether given the whole gates.yaml or just that section."""
    return gates.get("offline", gates)


def budget_for(slice_name: str, metric: str, offline: Mapping[str, Any]) -> float | None:
    """The budget of ``metric`` on ``slice_name``: first matching override, else the default."""
    for pattern, overrides in (offline.get("slice_overrides") or {}).items():
        if fnmatchcase(slice_name, str(pattern)):
            if metric in (overrides or {}):
                return float(overrides[metric])
            break
    default = (offline.get("budgets") or {}).get(metric)
    return None if default is None else float(default)


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def first_release_floors(gates: Mapping[str, Any]) -> dict[str, float]:
    """``metric → margin`` a first candidate must beat the no-camera baselines by.

    From ``offline.first_release.beat_baseline_by`` (accuracy/F1: absolute gain; MAE: metres
    less). Empty when not configured: then a first release is only reported, never gated.
    """
    section = offline_gates(gates).get("first_release") or {}
    return {str(m): float(v) for m, v in (section.get("beat_baseline_by") or {}).items()}


def baseline_margin(metric: str, baseline_value: float, gates: Mapping[str, Any]) -> float | None:
    """The margin ``metric`` must beat ``baseline_value`` by on one slice (None: not gated).

    The configured margin, capped at ``max_share_of_baseline_error`` of the baseline's own
    error (``1 - value`` for accuracy/F1, the value itself for an MAE): where the constant
    guess is already near-perfect (an intersection's side lanes do not exist and are labelled
    occupied in every frame), no model can gain a fixed 0.05, but it must still do better
    than the guess.
    """
    floors = first_release_floors(gates)
    if metric not in floors:
        return None
    section = offline_gates(gates).get("first_release") or {}
    share = section.get("max_share_of_baseline_error")
    if share is None or not _finite(baseline_value):
        return floors[metric]
    error = 1.0 - baseline_value if HIGHER_IS_BETTER.get(metric, True) else baseline_value
    return min(floors[metric], float(share) * max(0.0, error))


@dataclass(frozen=True)
class OfflineSignificance:
    """``offline.significance``: the family-wise level of the per-row tests and the bootstrap's
    resamples (``None`` from :meth:`load` when not configured: budgets alone)."""

    alpha: float
    resamples: int

    @classmethod
    def load(cls, offline: Mapping[str, Any]) -> OfflineSignificance | None:
        section = offline.get("significance")
        if not section:
            return None
        alpha = float(section["alpha"])
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"gates.yaml offline.significance.alpha must be in (0, 1): {alpha}")
        return cls(alpha=alpha, resamples=int(section["bootstrap_resamples"]))


def compare_with_production(
    candidate: pd.DataFrame,
    production: pd.DataFrame | None,
    gates: Mapping[str, Any],
    *,
    baseline: pd.DataFrame | None = None,
    evidence: PairedFrames | None = None,
) -> Comparison:
    """Gate ``candidate`` against ``production`` (both ``evaluate_by_slice`` tables).

    ``gates`` is gates.yaml (or its ``offline`` section). ``production=None`` means no model is
    deployed yet. Then, given the no-camera ``baseline`` table (``baselines.score_baselines`` on
    the same benchmark), the candidate must beat it on every gated slice by the margins of
    ``offline.first_release`` — a first release that has nothing to regress against still has
    to show it learned from the camera; the ``production`` column then holds the baseline and
    ``budget`` is the negated margin (regression must be at most ``-margin``). Without a
    baseline (or without configured margins) the comparison passes with a note and only
    lists the candidate's metrics. A slice the reference was measured on but the candidate was
    not is a failure: a candidate cannot pass by not being evaluated. ``evidence``: both
    models' per-frame scores against the reference used here (production, or the baseline on
    a first release), for the significance of each gated row (module docstring).
    """
    offline = offline_gates(gates)
    has_production = production is not None
    floors = first_release_floors(offline)
    if has_production:
        reference, name = production, "production"

        def budget_of(slice_: str, metric: str, reference_value: float) -> float | None:
            return budget_for(slice_, metric, offline)

        notes: list[str] = []
    elif baseline is not None and floors:
        reference, name = baseline, "baseline"

        def budget_of(slice_: str, metric: str, reference_value: float) -> float | None:
            margin = baseline_margin(metric, reference_value, offline)
            return None if margin is None else -margin

        notes = [FIRST_RELEASE_NOTE]
    else:
        reference, name, notes = None, "production", [NO_PRODUCTION_NOTE]

        def budget_of(slice_: str, metric: str, reference_value: float) -> float | None:
            return None

    table, failures, more_notes = _gate(
        candidate, reference, name, budget_of, int(offline.get("min_slice_frames", 0))
    )
    significance = OfflineSignificance.load(offline)
    if evidence is not None and significance is not None and reference is not None:
        failures = _beyond_chance(table, evidence, significance, first_release=name == "baseline")
        more_notes.append(
            f"a gated row fails only beyond chance: paired bootstrap over its frames "
            f"({significance.resamples} resamples), Holm over {int(table['gated'].sum())} "
            f"gated row-metrics at {significance.alpha:g}"
        )
    return Comparison(
        table=table,
        passed=not failures,
        failures=failures,
        notes=notes + more_notes,
        has_production=has_production,
        reference=name,
    )


def _gate(
    candidate: pd.DataFrame,
    reference: pd.DataFrame | None,
    name: str,
    budget_of: Callable[[str, str, float], float | None],
    min_frames: int,
) -> tuple[pd.DataFrame, list[str], list[str]]:
    """(long table, failures, notes) of ``candidate`` against ``reference`` per gated slice."""
    metrics = [m for m in METRIC_COLUMNS if m in candidate.columns]
    has_reference = reference is not None
    prod_rows = reference.set_index("slice") if has_reference else pd.DataFrame()
    cand_rows = candidate.set_index("slice")
    notes: list[str] = []
    failures: list[str] = []
    rows: list[dict[str, Any]] = []

    order = list(cand_rows.index)
    if has_reference:
        order += [s for s in prod_rows.index if s not in cand_rows.index]
    for slice_ in order:
        in_cand = slice_ in cand_rows.index
        in_prod = has_reference and slice_ in prod_rows.index
        source = cand_rows.loc[slice_] if in_cand else prod_rows.loc[slice_]
        frames = int(source["frames"])
        kind = str(source.get("kind", "slice"))
        if in_cand and in_prod and int(prod_rows.loc[slice_, "frames"]) != frames:
            notes.append(
                f"{slice_}: candidate scored on {frames} frames, {name} on "
                f"{int(prod_rows.loc[slice_, 'frames'])} — not the same benchmark"
            )
        for metric in metrics:
            cand = float(cand_rows.loc[slice_, metric]) if in_cand else float("nan")
            prod = float(prod_rows.loc[slice_, metric]) if in_prod else float("nan")
            budget = budget_of(str(slice_), metric, prod)
            gated = bool(in_prod and budget is not None and frames >= min_frames and _finite(prod))
            row = _metric_row(str(slice_), kind, metric, frames, cand, prod, budget, gated)
            if not row["passed"]:
                failures.append(
                    _failure(slice_, metric, cand, prod, row["delta"], budget, frames, name)
                    if _finite(cand)
                    else f"{slice_} {metric}: candidate not evaluated ({name} {prod:.3f})"
                )
            rows.append(row)
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    if has_reference and len(table):
        small = sorted(table.loc[table["frames"] < min_frames, "slice"].unique())
        if small:
            notes.append(
                f"{len(small)} slice(s) below {min_frames} frames are reported but not gated"
            )
    return table, failures, notes


def _beyond_chance(
    table: pd.DataFrame,
    evidence: PairedFrames,
    significance: OfflineSignificance,
    *,
    first_release: bool,
) -> list[str]:
    """Re-judge every gated row in place (``passed``, ``standard_error``, ``p_value``,
    ``level``): over its budget *and* beyond chance. Returns the failures."""
    tests: dict[int, Any] = {}
    gated = table[table["gated"] & table["candidate"].map(_finite)]
    for slice_, rows in gated.groupby("slice", sort=False):
        offsets = {
            str(row.metric): float(row.budget) if first_release else 0.0
            for row in rows.itertuples()
        }
        found = row_tests(evidence, str(slice_), offsets, resamples=significance.resamples)
        for index, row in rows.iterrows():
            if str(row["metric"]) in found:
                tests[index] = found[str(row["metric"])]
    p_values = {index: test.p_value for index, test in tests.items()}
    rejected = holm_rejections(p_values, significance.alpha) if p_values else {}
    failures = []
    for index, row in table.iterrows():
        if not row["gated"]:
            continue
        if index not in tests:  # not evaluated on the candidate: fails as before
            if not row["passed"]:
                reference = "baseline" if first_release else "production"
                failures.append(
                    f"{row['slice']} {row['metric']}: candidate not evaluated "
                    f"({reference} {row['production']:.3f})"
                )
            continue
        test = tests[index]
        level = holm_level(p_values, index, significance.alpha)
        over = bool(row["regression"] > row["budget"] + _TOLERANCE)
        passed = not (over and index in rejected)
        table.loc[index, ["standard_error", "p_value", "level", "passed"]] = [
            test.standard_error,
            test.p_value,
            level,
            passed,
        ]
        if not passed:
            failures.append(
                _failure(
                    row["slice"],
                    row["metric"],
                    row["candidate"],
                    row["production"],
                    row["delta"],
                    row["budget"],
                    int(row["frames"]),
                    "baseline" if first_release else "production",
                )
                + f"; beyond chance: p = {test.p_value:.2g} <= Holm level {level:.2g}"
                f" (bootstrap SE {test.standard_error:.3f})"
            )
    return failures


def _metric_row(
    slice_: str,
    kind: str,
    metric: str,
    frames: int,
    cand: float,
    prod: float,
    budget: float | None,
    gated: bool,
) -> dict[str, Any]:
    """One slice and metric of the long table: the change, as a regression, against its budget
    (an ungated row passes; a gated one the candidate was not evaluated on fails)."""
    delta = cand - prod if _finite(cand) and _finite(prod) else float("nan")
    higher = HIGHER_IS_BETTER.get(metric, True)
    regression = (-delta if higher else delta) if _finite(delta) else float("nan")
    if not gated:
        passed = True
    elif not _finite(cand):
        passed = False
    else:
        passed = bool(regression <= budget + _TOLERANCE)
    return {
        "slice": slice_,
        "kind": kind,
        "metric": metric,
        "frames": frames,
        "candidate": cand,
        "production": prod,
        "delta": delta,
        "regression": regression,
        "budget": budget if budget is not None else float("nan"),
        "gated": gated,
        "passed": passed,
        "standard_error": float("nan"),
        "p_value": float("nan"),
        "level": float("nan"),
    }


def _failure(
    slice_: str,
    metric: str,
    cand: float,
    prod: float,
    delta: float,
    budget: float,
    frames: int,
    name: str,
) -> str:
    """One failure line: a regression beyond budget, or a baseline not beaten by the margin."""
    higher = HIGHER_IS_BETTER.get(metric, True)
    if name == "baseline":
        better = "above" if higher else "below"
        return (
            f"{slice_} {metric}: candidate {cand:.3f} vs no-camera baseline {prod:.3f} "
            f"(delta {delta:+.3f}; must be {-budget:.3f} {better} it, {frames} frames)"
        )
    direction = "drop" if higher else "increase"
    return (
        f"{slice_} {metric}: candidate {cand:.3f} vs {name} {prod:.3f} "
        f"(delta {delta:+.3f}, budget {budget:.3f} {direction}, {frames} frames)"
    )
