"""Shadow mode: the certified candidate perceives beside production; only production drives.

Over recent fleet logs on ``main`` both engines see the same camera frames; each engine's
perception goes through its own :class:`~aiinfra_pipelines.fleet.planner.RulePlanner`, frame by
frame in log order (the planner keeps state: closing speed, lane-change cooldown), so the
comparison is of *decisions*, what the car would have done, not only of network outputs.
Reported: decision agreement, occupancy agreement, fallback rates and the confidence shift per
slice. Every disagreeing frame is mined back as a badcase, in the same table shape as
``mined_badcases`` (under its published prefix), so the next training dataset includes it and
the retraining sensor counts it.

Pure functions: the asset reads the lake and calls these; the tests call them on real engines.
The distribution helpers (:func:`psi`, :func:`ks_statistic`) are shared with rollout and the
drift monitor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.fleet.perception import Perception
from aiinfra_pipelines.fleet.planner import ACTION_NAMES, PlannerConfig, RulePlanner
from aiinfra_pipelines.lake.io_manager import DATA_PREFIX, read_parquet_prefix
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.mining.rules import BADCASE_COLUMNS, TAGS
from aiinfra_pipelines.perception.engine import Predictions

# Shadow badcases live beside mining's per-log partitions in the mined-badcase view
# (``read_asset_partitions(lake, "mined_badcases", ...)`` reads every Parquet under the asset
# prefix), which is what ``datasets.selection`` and the retraining sensor read. Drive-log
# partition keys always start with ``ingest-``, so ``shadow/`` can never collide with one.
SHADOW_BADCASES_PREFIX = f"{DATA_PREFIX}/mined_badcases/shadow/"
SHADOW_REPORTS_PREFIX = "release/shadow/"
SHADOW_REASON = "shadow_disagreement"
SHADOW_COLUMNS = (
    "production_action",
    "candidate_action",
    "production_confidence",
    "candidate_confidence",
    "occupancy_agreement",
    "lead_gap_diff_m",
)


@dataclass(frozen=True)
class ShadowSettings:
    """``gates.yaml`` → ``release.shadow``."""

    max_logs: int
    max_age_days: float
    max_frames: int
    min_frames: int
    min_occupancy_agreement: float
    max_fallback_rate_increase: float

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> ShadowSettings:
        """From ``gates.yaml`` (or ``config``, the whole gates mapping); errors name the key."""
        gates = settings_section("gates.yaml", "", config)
        nested = bool((gates.raw("release", None) or {}).get("shadow"))
        if not nested and not gates.raw("shadow", None):
            raise KeyError("gates.yaml has no release.shadow section (shadow mode settings)")
        path = "release.shadow" if nested else "shadow"  # top level: older gates files
        section = settings_section("gates.yaml", path, gates.values)
        window = section.section("window")
        return cls(
            max_logs=window.int("max_logs"),
            max_age_days=window.float("max_age_days"),
            max_frames=window.int("max_frames"),
            min_frames=section.int("min_frames"),
            min_occupancy_agreement=section.float("min_occupancy_agreement"),
            max_fallback_rate_increase=section.float("max_fallback_rate_increase"),
        )


def shadow_report_key(model_version: str) -> str:
    return f"{SHADOW_REPORTS_PREFIX}{model_version}.json"


def shadow_badcases_key(model_version: str) -> str:
    return f"{SHADOW_BADCASES_PREFIX}{model_version}.parquet"


# ------------------------------------------------------------------------ recent fleet logs
def recent_rows(
    index: pd.DataFrame, max_logs: int, max_age_days: float, max_frames: int | None = None
) -> pd.DataFrame:
    """Scene-index rows of the newest logs: the "recent fleet" window shadow and drift read.

    Logs are ranked by ``recorded_at`` (newest first, log id breaking ties); a log is in the
    window when it is at most ``max_age_days`` older than the newest log and among the first
    ``max_logs``; whole logs are taken until ``max_frames`` would be exceeded (the newest log is
    always taken). Relative to the newest log rather than the wall clock, so a replayed or
    simulated fleet with an old clock has a "recent" too.
    """
    if index.empty:
        return index.copy()
    recorded = pd.to_datetime(index["recorded_at"], utc=True, format="ISO8601")
    logs = (
        pd.DataFrame({"log_id": index["log_id"], "recorded_at": recorded})
        .groupby("log_id", sort=False)
        .agg(recorded_at=("recorded_at", "max"), frames=("recorded_at", "size"))
        .reset_index()
        .sort_values(["recorded_at", "log_id"], ascending=[False, False])
    )
    newest = logs["recorded_at"].iloc[0]
    logs = logs[logs["recorded_at"] >= newest - timedelta(days=max_age_days)].head(max_logs)
    if max_frames is not None:
        cumulative = logs["frames"].cumsum()
        logs = logs[(cumulative <= max_frames) | (np.arange(len(logs)) == 0)]
    chosen = index[index["log_id"].isin(set(logs["log_id"]))]
    return chosen.sort_values(["log_id", "timestamp_ns"]).reset_index(drop=True)


# ------------------------------------------------------------------ distribution comparisons
def histogram(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``values`` in the bins ``edges`` (outer bins catch everything beyond)."""
    inner = np.asarray(edges, dtype=float)[1:-1]
    return np.bincount(np.searchsorted(inner, values, side="right"), minlength=len(edges) - 1)


def psi(expected: np.ndarray, actual: np.ndarray, epsilon: float = 1e-4) -> float:
    """Population stability index of two histograms over the same bins (counts or shares).

    Σ (a - e) · ln(a / e) over bin shares; empty bins are floored at ``epsilon`` so a bin
    present on one side only counts as a large, finite shift. Symmetric; 0 = identical.
    """
    expected = np.asarray(expected, dtype=float)
    actual = np.asarray(actual, dtype=float)
    if expected.shape != actual.shape or expected.ndim != 1:
        raise ValueError(f"histograms must have the same bins: {expected.shape} vs {actual.shape}")
    if expected.sum() <= 0 or actual.sum() <= 0:
        raise ValueError("psi needs two non-empty histograms")
    e = np.clip(expected / expected.sum(), epsilon, None)
    a = np.clip(actual / actual.sum(), epsilon, None)
    return float(np.sum((a - e) * np.log(a / e)))


def ks_statistic(first: np.ndarray, second: np.ndarray) -> float:
    """Two-sample Kolmogorov–Smirnov statistic: the largest gap between the empirical CDFs."""
    first = np.sort(np.asarray(first, dtype=float))
    second = np.sort(np.asarray(second, dtype=float))
    if first.size == 0 or second.size == 0:
        raise ValueError("ks_statistic needs two non-empty samples")
    grid = np.concatenate([first, second])
    cdf_first = np.searchsorted(first, grid, side="right") / first.size
    cdf_second = np.searchsorted(second, grid, side="right") / second.size
    return float(np.max(np.abs(cdf_first - cdf_second)))


# ------------------------------------------------------------------- decisions, frame by frame
def plan_actions(
    frames: pd.DataFrame, predictions: Predictions, planner_config: PlannerConfig | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(action id, fallback flag) per row of ``frames`` as the rule planner decides them.

    Frames are replayed per log in timestamp order with a fresh planner for each log (the
    planner's closing-speed estimate must not leak across logs); results come back in row order.
    ``frames`` needs ``log_id``, ``timestamp_ns`` and ``speed_mps``.
    """
    n = len(frames)
    if len(predictions.confidence) != n:
        raise ValueError(f"{n} frames but {len(predictions.confidence)} predictions")
    config = planner_config or PlannerConfig.from_config()
    actions = np.zeros(n, dtype=np.int64)
    fallback = np.zeros(n, dtype=bool)
    positions = np.arange(n)
    order = frames.assign(_row=positions).sort_values(["log_id", "timestamp_ns"], kind="stable")
    speeds = frames["speed_mps"].to_numpy(dtype=float)
    confidence = np.clip(np.asarray(predictions.confidence, dtype=float), 0.0, 1.0)
    for _, rows in order.groupby("log_id", sort=False):
        planner = RulePlanner(config)
        for row in rows["_row"].to_numpy():
            decision = planner.act(
                Perception(
                    occupancy=np.asarray(predictions.occupancy[row]),
                    lead_gap_m=float(predictions.lead_gap_m[row]),
                    confidence=float(confidence[row]),
                ),
                float(speeds[row]),
            )
            actions[row] = decision.action
            fallback[row] = decision.fallback
    return actions, fallback


def compare_engines(
    frames: pd.DataFrame,
    production: Predictions,
    candidate: Predictions,
    settings: ShadowSettings,
    planner_config: PlannerConfig | None = None,
) -> pd.DataFrame:
    """One row per frame: both engines' decisions, confidences and agreement.

    ``disagreement`` marks frames whose actions differ or whose thresholded occupancy grids
    agree on fewer than ``settings.min_occupancy_agreement`` of the cells.
    """
    config = planner_config or PlannerConfig.from_config()
    production_actions, production_fallback = plan_actions(frames, production, config)
    candidate_actions, candidate_fallback = plan_actions(frames, candidate, config)
    threshold = config.occupied_threshold
    n = len(frames)
    production_cells = (np.asarray(production.occupancy) >= threshold).reshape(n, -1)
    candidate_cells = (np.asarray(candidate.occupancy) >= threshold).reshape(n, -1)
    occupancy_agreement = (production_cells == candidate_cells).mean(axis=1) if n else np.zeros(0)
    comparison = pd.DataFrame(
        {
            "log_id": frames["log_id"].to_numpy(),
            "frame_index": frames["frame_index"].to_numpy(),
            "timestamp_ns": frames["timestamp_ns"].to_numpy(dtype=np.int64),
        }
    )
    for tag in (*TAGS, "events"):
        comparison[tag] = frames[tag].fillna("").astype(str).to_numpy() if tag in frames else ""
    comparison["production_action"] = [ACTION_NAMES[int(a)] for a in production_actions]
    comparison["candidate_action"] = [ACTION_NAMES[int(a)] for a in candidate_actions]
    comparison["action_agree"] = production_actions == candidate_actions
    comparison["production_fallback"] = production_fallback
    comparison["candidate_fallback"] = candidate_fallback
    comparison["occupancy_agreement"] = occupancy_agreement
    comparison["production_confidence"] = np.asarray(production.confidence, dtype=float)
    comparison["candidate_confidence"] = np.asarray(candidate.confidence, dtype=float)
    comparison["lead_gap_diff_m"] = np.abs(
        np.asarray(candidate.lead_gap_m, dtype=float) - np.asarray(production.lead_gap_m, float)
    )
    comparison["disagreement"] = ~comparison["action_agree"] | (
        comparison["occupancy_agreement"] < settings.min_occupancy_agreement
    )
    return comparison


def _confidence_shift(production: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    edges = np.linspace(0.0, 1.0, 11)
    return {
        "production_mean": float(production.mean()),
        "candidate_mean": float(candidate.mean()),
        "mean_shift": float(candidate.mean() - production.mean()),
        "production_p10": float(np.percentile(production, 10)),
        "candidate_p10": float(np.percentile(candidate, 10)),
        "ks": ks_statistic(production, candidate),
        "psi": psi(histogram(production, edges), histogram(candidate, edges)),
    }


def per_slice_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """Agreement and confidence shift per slice, worst decision agreement first."""
    rows = []
    for slice_name, part in comparison.groupby("slice", sort=True):
        shift = _confidence_shift(
            part["production_confidence"].to_numpy(), part["candidate_confidence"].to_numpy()
        )
        rows.append(
            {
                "slice": slice_name,
                "frames": len(part),
                "decision_agreement": float(part["action_agree"].mean()),
                "occupancy_agreement": float(part["occupancy_agreement"].mean()),
                "production_fallback_rate": float(part["production_fallback"].mean()),
                "candidate_fallback_rate": float(part["candidate_fallback"].mean()),
                "production_confidence": shift["production_mean"],
                "candidate_confidence": shift["candidate_mean"],
                "confidence_shift": shift["mean_shift"],
                "confidence_ks": shift["ks"],
            }
        )
    columns = [
        "slice",
        "frames",
        "decision_agreement",
        "occupancy_agreement",
        "production_fallback_rate",
        "candidate_fallback_rate",
        "production_confidence",
        "candidate_confidence",
        "confidence_shift",
        "confidence_ks",
    ]
    table = pd.DataFrame(rows, columns=columns)
    return table.sort_values(["decision_agreement", "slice"]).reset_index(drop=True)


def shadow_summary(comparison: pd.DataFrame, settings: ShadowSettings) -> dict[str, Any]:
    """The shadow verdict and its figures (what the report and the rollout state record).

    Passes when enough frames were compared and the candidate falls back at most
    ``max_fallback_rate_increase`` more often than production; agreement is reported, not
    gated (see gates.yaml).
    """
    frames = len(comparison)
    reasons: list[str] = []
    if frames < settings.min_frames:
        reasons.append(f"only {frames} recent frames compared (minimum {settings.min_frames})")
    if frames == 0:
        return {"frames": 0, "logs": 0, "passed": False, "reasons": reasons}
    production_fallback = float(comparison["production_fallback"].mean())
    candidate_fallback = float(comparison["candidate_fallback"].mean())
    if candidate_fallback - production_fallback > settings.max_fallback_rate_increase:
        reasons.append(
            f"candidate falls back on {candidate_fallback:.1%} of frames, production on "
            f"{production_fallback:.1%} (allowed increase "
            f"{settings.max_fallback_rate_increase:.1%})"
        )
    transitions = (
        comparison.loc[~comparison["action_agree"]]
        .groupby(["production_action", "candidate_action"])
        .size()
        .sort_values(ascending=False)
    )
    return {
        "frames": frames,
        "logs": int(comparison["log_id"].nunique()),
        "decision_agreement": float(comparison["action_agree"].mean()),
        "occupancy_agreement": float(comparison["occupancy_agreement"].mean()),
        "production_fallback_rate": production_fallback,
        "candidate_fallback_rate": candidate_fallback,
        "disagreements": int(comparison["disagreement"].sum()),
        "confidence": _confidence_shift(
            comparison["production_confidence"].to_numpy(),
            comparison["candidate_confidence"].to_numpy(),
        ),
        "action_changes": {f"{p}->{c}": int(n) for (p, c), n in transitions.items()},
        "passed": not reasons,
        "reasons": reasons,
    }


def shadow_badcases(
    comparison: pd.DataFrame, model_version: str, engine_sha256: str
) -> pd.DataFrame:
    """Disagreeing frames as badcase rows: ``mined_badcases`` columns plus the shadow figures.

    ``confidence`` is the candidate's (the engine being released), ``disagreement`` the share
    of occupancy cells the engines decided differently; ``lead_gap_error_m`` stays empty (no
    label was compared), the engines' gap difference is ``lead_gap_diff_m``.
    """
    hard = comparison[comparison["disagreement"]].reset_index(drop=True)
    badcases = pd.DataFrame(
        {
            "log_id": hard["log_id"].astype(str),
            "frame_index": hard["frame_index"].astype(np.int64),
            "timestamp_ns": hard["timestamp_ns"].astype(np.int64),
            **{tag: hard[tag].astype(str) for tag in TAGS},
            "reasons": SHADOW_REASON,
            "confidence": hard["candidate_confidence"].astype(float),
            "flip_count": np.zeros(len(hard), dtype=np.int64),
            "disagreement": 1.0 - hard["occupancy_agreement"].astype(float),
            "lead_gap_error_m": np.full(len(hard), np.nan),
            "events": hard["events"].astype(str),
        }
    )[list(BADCASE_COLUMNS)]
    for column in SHADOW_COLUMNS:
        badcases[column] = hard[column].to_numpy()
    return badcases.assign(
        engine_version=str(model_version), engine_sha=str(engine_sha256), source="shadow"
    )


def shadow_badcases_view(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """Every shadow badcase on ``ref`` (all candidates); they are also in the mined view."""
    return read_parquet_prefix(lake, ref, SHADOW_BADCASES_PREFIX)


def shadow_agreement(records: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per shadow engine: vehicles, frames and the share of decisions the driven plan shared.

    Older published tables have no shadow columns: nothing ran in shadow there.
    """
    if records.empty or "shadow_engine_sha256" not in records:
        return {}
    shadowed = records[records["shadow_engine_sha256"].fillna("") != ""]
    summary = {}
    for sha, part in shadowed.groupby("shadow_engine_sha256"):
        frames = int(part["shadow_frames"].sum())
        summary[str(sha)] = {
            "vehicles": int(part["vehicle_pseudonym"].nunique()),
            "frames": frames,
            "decision_agreement": (
                round(float(part["shadow_agreements"].sum() / frames), 4) if frames else None
            ),
        }
    return summary
