"""A rollout stage judged as a statistical decision: every metric's sequential test against
the concurrent control cohort, and what it adds up to (roll back, advance, keep collecting).

Safety events (at-fault collisions, near misses) are rare counts over exposure: each is judged
by :mod:`aiinfra_pipelines.statistics.sequential_rates` on the stage's telemetry batch by batch
(the conditional binomial of the candidates' share of events, always-valid mixture likelihood
ratios for harm and for non-inferiority within the margin). The budgeted per-vehicle metrics
(fallback rate, latency p95, confidence drop) are means over records: a one-sided Welch bound
on the candidate's worsening against the budget, at a level spent over the stage's looks
(``alpha·6/(π²k²)`` at look ``k``: the levels sum to ``alpha`` however many looks there are).

* **harm** — any metric shown worse (an event rate above the control's; a mean worse by more
  than its budget): the stage rolls back, naming each;
* **non-inferior** — every metric shown within its margin or budget: the stage may advance;
* otherwise **keep collecting**, with the candidate exposure still needed for the slowest
  undecided event test to decide at the rates seen so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from aiinfra_pipelines.statistics.sequential_rates import RateBatch, RateVerdict, judge_rates

from .rollout_metrics import Breach, event_counts
from .rollout_settings import RolloutSettings

# Per-record value of each budgeted metric, and whether an increase is worse.
_BUDGETED: dict[str, tuple[str, bool]] = {
    "fallback_rate": ("fallback_rate", True),
    "latency_p95_ms": ("latency_ms_p95", True),
    "confidence_mean_drop": ("confidence_mean", False),
}


@dataclass(frozen=True)
class BudgetVerdict:
    """A budgeted mean metric: the candidate's worsening, its one-sided bounds, the outcome."""

    metric: str
    outcome: str  # harm | non_inferior | undecided
    worsening: float | None  # candidate minus control, signed so that positive is worse
    lower: float | None
    upper: float | None
    budget: float
    level: float
    candidate: float | None
    control: float | None

    def as_dict(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None or not math.isfinite(value) else round(value, 6)

        return {
            "metric": self.metric,
            "outcome": self.outcome,
            "worsening": rounded(self.worsening),
            "bounds": [rounded(self.lower), rounded(self.upper)],
            "budget": self.budget,
            "level": self.level,
            "candidate": rounded(self.candidate),
            "control": rounded(self.control),
        }


@dataclass(frozen=True)
class StageJudgement:
    """Every metric's verdict on one stage's telemetry, and the stage's outcome."""

    events: dict[str, RateVerdict]
    budgets: dict[str, BudgetVerdict]
    candidate_frames: int
    frame_rate_hz: float

    @property
    def harms(self) -> tuple[Breach, ...]:
        found = []
        for name, verdict in self.events.items():
            if verdict.outcome == "harm":
                per_1k = 1000.0
                found.append(
                    Breach(
                        f"{name}_per_1k_frames",
                        verdict.candidate_events / verdict.candidate_exposure * per_1k,
                        verdict.control_events / verdict.control_exposure * per_1k,
                        0.0,
                    )
                )
        for verdict in self.budgets.values():
            if verdict.outcome == "harm" and verdict.candidate is not None:
                found.append(
                    Breach(
                        verdict.metric, verdict.candidate, float(verdict.control), verdict.budget
                    )
                )
        return tuple(found)

    @property
    def non_inferior(self) -> bool:
        outcomes = [v.outcome for v in (*self.events.values(), *self.budgets.values())]
        return all(outcome == "non_inferior" for outcome in outcomes)

    @property
    def exposure_needed_frames(self) -> int | None:
        """Candidate frames still needed before every event test has decided (``None``: some
        test cannot decide at the rates seen, or nothing is pending)."""
        pending = [v for v in self.events.values() if v.outcome == "undecided"]
        if not pending or any(v.exposure_needed is None for v in pending):
            return None
        return math.ceil(max(float(v.exposure_needed or 0.0) for v in pending))

    def summary(self) -> str:
        """One line per undecided metric, and the exposure still needed."""
        parts = []
        for name, verdict in self.events.items():
            if verdict.outcome != "undecided":
                continue
            low, high = verdict.ratio_interval
            ratio = "n/a" if verdict.rate_ratio is None else f"{verdict.rate_ratio:.2f}"
            upper = "inf" if high is None else f"{high:.2f}"
            parts.append(
                f"{name} {verdict.candidate_events:g} in {verdict.candidate_exposure:g} frames "
                f"vs {verdict.control_events:g} in {verdict.control_exposure:g} (rate ratio "
                f"{ratio}, 95 % CI {low:.2f}-{upper})"
            )
        parts += [
            f"{v.metric} worsening {v.worsening:.4g} within [{v.lower:.4g}, {v.upper:.4g}] "
            f"against budget {v.budget:g}"
            for v in self.budgets.values()
            if v.outcome == "undecided" and v.worsening is not None
        ]
        parts += [
            f"{v.metric}: too few records to judge"
            for v in self.budgets.values()
            if v.outcome == "undecided" and v.worsening is None
        ]
        needed = self.exposure_needed_frames
        tail = (
            "no amount of exposure decides at the rates seen so far"
            if needed is None
            else f"about {needed:,} more candidate frames "
            f"(~{needed / self.frame_rate_hz / 3600:.1f} h of driving) for a decision either way"
        )
        return "keep collecting: " + "; ".join(parts) + f"; {tail}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": {name: verdict.as_dict() for name, verdict in self.events.items()},
            "budgets": {name: verdict.as_dict() for name, verdict in self.budgets.items()},
        }


def _record_values(records: pd.DataFrame, metric: str) -> np.ndarray:
    if records.empty:
        return np.zeros(0)
    if metric == "fallback_rate":
        frames = records["frames"].to_numpy(float)
        return records["fallback_frames"].to_numpy(float) / np.maximum(frames, 1.0)
    if metric == "latency_ms_p95":
        return records["latency_ms_p95"].to_numpy(float)
    histograms = [np.asarray(h, dtype=float) for h in records["confidence_histogram"]]
    means = []
    for histogram in histograms:
        centres = (np.arange(len(histogram)) + 0.5) / max(len(histogram), 1)
        total = histogram.sum()
        means.append(float(np.sum(histogram * centres) / total) if total else float("nan"))
    return np.asarray(means)


def budget_verdict(
    metric: str,
    candidate: pd.DataFrame,
    control: pd.DataFrame,
    budget: float,
    level: float,
) -> BudgetVerdict:
    """One budgeted mean metric, judged with a one-sided Welch bound at ``level``."""
    column, increase_is_worse = _BUDGETED[metric]
    ours = _record_values(candidate, column)
    theirs = _record_values(control, column)
    ours, theirs = ours[np.isfinite(ours)], theirs[np.isfinite(theirs)]
    if len(ours) < 2 or len(theirs) < 2:
        mean_c = float(ours.mean()) if len(ours) else None
        mean_0 = float(theirs.mean()) if len(theirs) else None
        return BudgetVerdict(metric, "undecided", None, None, None, budget, level, mean_c, mean_0)
    sign = 1.0 if increase_is_worse else -1.0
    worsening = sign * (float(ours.mean()) - float(theirs.mean()))
    var_c, var_0 = ours.var(ddof=1) / len(ours), theirs.var(ddof=1) / len(theirs)
    se = math.sqrt(var_c + var_0)
    if se == 0.0:
        lower = upper = worsening
    else:
        dof = (var_c + var_0) ** 2 / (
            var_c**2 / (len(ours) - 1) + var_0**2 / (len(theirs) - 1) or 1e-300
        )
        margin = float(student_t.isf(level, max(dof, 1.0))) * se
        lower, upper = worsening - margin, worsening + margin
    outcome = "harm" if lower > budget else "non_inferior" if upper < budget else "undecided"
    return BudgetVerdict(
        metric,
        outcome,
        worsening,
        lower,
        upper,
        budget,
        level,
        float(ours.mean()),
        float(theirs.mean()),
    )


def look_level(alpha: float, look: int) -> float:
    """The level of look ``look`` (1-based): ``alpha·6/(π²k²)``, summing to ``alpha``."""
    return alpha * 6.0 / (math.pi**2 * max(look, 1) ** 2)


def _batches(candidate: pd.DataFrame, control: pd.DataFrame, column: str) -> list[RateBatch]:
    """Per telemetry batch: each cohort's events of ``column`` and frames."""

    def by_batch(records: pd.DataFrame) -> pd.DataFrame:
        if records.empty:
            return pd.DataFrame(columns=["events", "frames"])
        keys = records["batch_id"] if "batch_id" in records else pd.Series("", index=records.index)
        events = event_counts(records, column)
        return (
            pd.DataFrame({"events": events, "frames": records["frames"], "batch": keys})
            .groupby("batch")[["events", "frames"]]
            .sum()
        )

    ours, theirs = by_batch(candidate), by_batch(control)
    batches = []
    for batch in sorted(set(ours.index) | set(theirs.index)):
        c = ours.loc[batch] if batch in ours.index else None
        o = theirs.loc[batch] if batch in theirs.index else None
        batches.append(
            RateBatch(
                float(c["events"]) if c is not None else 0.0,
                float(c["frames"]) if c is not None else 0.0,
                float(o["events"]) if o is not None else 0.0,
                float(o["frames"]) if o is not None else 0.0,
            )
        )
    return batches


def judge_stage(
    settings: RolloutSettings, candidate: pd.DataFrame, control: pd.DataFrame, look: int
) -> StageJudgement:
    """Every metric's sequential verdict on the stage's records (look ``look`` of the stage)."""
    events = {
        name: judge_rates(
            event.test,
            _batches(candidate, control, event.column),
            event.control_rate_per_1k_frames / 1000.0,
        )
        for name, event in settings.events.items()
    }
    level = look_level(settings.budget_alpha, look)
    budgets = {
        metric: budget_verdict(metric, candidate, control, budget, level)
        for metric, budget in settings.budgets.items()
    }
    return StageJudgement(
        events=events,
        budgets=budgets,
        candidate_frames=int(candidate["frames"].sum()) if not candidate.empty else 0,
        frame_rate_hz=settings.frame_rate_hz,
    )
