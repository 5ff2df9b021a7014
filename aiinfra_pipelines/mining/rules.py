"""Badcase selection: which indexed frames are worth labelling and training on, and why.

The deployed engine's predictions on new fleet frames are scored per frame and a frame is a
badcase when any enabled rule in ``resources/mining.yaml`` fires:

* ``low_confidence`` — the engine itself was unsure (the car would have fallen back);
* ``temporal_instability`` — the thresholded occupancy grid flickered against the previous
  frame of the same log (real traffic does not jump several cells in 0.2 s);
* ``label_disagreement`` — the prediction disagrees with the auto-label (occupancy cells or
  lead gap), i.e. the model is simply wrong here;
* ``logged_event`` — the vehicle logged a safety event at this frame (near collision, hard
  brake, low TTC, takeover): hard by definition, whatever the model said.

Every row keeps its log, frame, slice tags and all its reasons, so a dataset can stratify by
slice and an operator can see which rule is feeding the loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.ingest.tables import slice_name
from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec
from aiinfra_pipelines.perception.engine import Predictions

from .settings import RuleSettings

KEYS: tuple[str, str] = ("log_id", "frame_index")
TAGS: tuple[str, ...] = ("slice", "lighting", "weather", "road_type")
REASONS: tuple[str, ...] = (
    "label_disagreement",
    "logged_event",
    "low_confidence",
    "temporal_instability",
)
BADCASE_COLUMNS: tuple[str, ...] = (
    "log_id",
    "frame_index",
    "timestamp_ns",
    *TAGS,
    "reasons",
    "confidence",
    "flip_count",
    "disagreement",
    "lead_gap_error_m",
    "events",
)


def _check_lengths(frames: pd.DataFrame, predictions: Predictions, labels: Any) -> None:
    n = len(frames)
    sizes = {
        "predictions.occupancy": len(predictions.occupancy),
        "predictions.lead_gap_m": len(predictions.lead_gap_m),
        "predictions.confidence": len(predictions.confidence),
    }
    if labels is not None:
        sizes["labels occupancy"] = len(labels[0])
        sizes["labels lead gap"] = len(labels[1])
    wrong = {name: size for name, size in sizes.items() if size != n}
    if wrong:
        raise ValueError(f"{n} frames but mismatched arrays (row-aligned required): {wrong}")


def frame_context(
    frames: pd.DataFrame, index: pd.DataFrame | None, event_rules: list[str]
) -> pd.DataFrame:
    """Slice tags and counted event flags per frame row, from the scene index where it has them.

    The scene index is the catalogue of record for tags and per-frame events; tags already on
    ``frames`` (test tables, joined views) are the fallback. A missing flag column (a rule the
    fleet never logs, such as ``takeover`` in simulation) reads as "did not fire".
    """
    context = frames[list(KEYS)].reset_index(drop=True)
    index_columns: list[str] = []
    if index is not None and len(index.columns):
        wanted = [c for c in (*TAGS, "events") if c in index.columns]
        wanted += [f"event_{r}" for r in event_rules if f"event_{r}" in index.columns]
        index_columns = wanted
        lookup = index[[*KEYS, *wanted]].drop_duplicates(subset=list(KEYS), keep="last")
        context = context.merge(lookup, on=list(KEYS), how="left", validate="many_to_one")
    for tag in TAGS:
        from_frames = (
            frames[tag].reset_index(drop=True)
            if tag in frames.columns
            else pd.Series([None] * len(frames))
        )
        if tag in index_columns:
            context[tag] = context[tag].where(context[tag].notna(), from_frames)
        else:
            context[tag] = from_frames
    missing_slice = context["slice"].isna()
    if missing_slice.any() and all(context[t].notna().all() for t in TAGS[1:]):
        context.loc[missing_slice, "slice"] = [
            slice_name(lighting, weather, road)
            for lighting, weather, road in context.loc[
                missing_slice, ["lighting", "weather", "road_type"]
            ].itertuples(index=False)
        ]
    for tag in TAGS:
        context[tag] = context[tag].fillna("").astype(str)
    per_frame_events = (
        context["events"].fillna("").astype(str).str.split(",")
        if "events" in index_columns
        else None
    )
    for rule in event_rules:
        column = f"event_{rule}"
        if column in index_columns:
            context[column] = context[column].eq(True).to_numpy(dtype=bool)
        elif per_frame_events is not None:  # older index without the flag column: parse names
            context[column] = per_frame_events.map(lambda names, r=rule: r in names)
        else:
            context[column] = False
    return context


def flip_counts(frames: pd.DataFrame, occupied: np.ndarray, max_frame_gap_s: float) -> np.ndarray:
    """Cells whose thresholded occupancy changed against the previous frame of the same log.

    Frames are ordered by timestamp within each log; the count belongs to the later frame. The
    first frame of a log, and a frame more than ``max_frame_gap_s`` after its predecessor, have
    nothing to compare with and count 0 — a flip is never counted across two logs.
    """
    n = len(frames)
    counts = np.zeros(n, dtype=np.int64)
    if n < 2:
        return counts
    log_codes, _ = pd.factorize(frames["log_id"].to_numpy())
    timestamps = frames["timestamp_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((timestamps, log_codes))
    cells = occupied.reshape(n, -1)[order]
    changed = (cells[1:] != cells[:-1]).sum(axis=1)
    same_log = log_codes[order][1:] == log_codes[order][:-1]
    close = np.diff(timestamps[order]) <= max_frame_gap_s * 1e9
    counts[order[1:]] = np.where(same_log & close, changed, 0)
    return counts


def score_frames(
    frames: pd.DataFrame,
    index: pd.DataFrame | None,
    predictions: Predictions,
    labels: tuple[np.ndarray, np.ndarray] | None,
    config: dict[str, Any] | None = None,
    *,
    spec: PerceptionSpec | None = None,
) -> pd.DataFrame:
    """Every frame with its rule scores and ``reasons`` ("" when no rule fired).

    Kept separate from :func:`mine_badcases` so callers can log score distributions (e.g. how
    close the fleet is to the confidence threshold) and not only the selected frames.
    ``predictions`` and ``labels`` are row-aligned with ``frames``; ``labels`` is
    ``(occupancy N×3×bins in {0,1}, lead gap normalized by spec.max_range_m)`` as
    ``ground_truth_labels`` returns it, or ``None`` where no auto-label exists (the
    disagreement rule then does not apply).
    """
    cfg = RuleSettings.load(config)
    spec = spec or perception_spec()
    _check_lengths(frames, predictions, labels)
    event_rules = list(cfg.event_rules)
    context = frame_context(frames, index, event_rules)
    n = len(frames)

    threshold = cfg.occupied_threshold
    occupied = np.asarray(predictions.occupancy) >= threshold
    confidence = np.asarray(predictions.confidence, dtype=np.float64)
    flips = flip_counts(frames, occupied, cfg.max_frame_gap_s)
    disagreement, gap_error = _label_errors(occupied, predictions, labels, spec)
    flag_matrix = (
        context[[f"event_{r}" for r in event_rules]].to_numpy(dtype=bool)
        if event_rules
        else np.zeros((n, 0), dtype=bool)
    )
    fired: dict[str, np.ndarray] = {
        "low_confidence": confidence < cfg.low_confidence_threshold,
        "temporal_instability": flips >= cfg.min_flipped_cells,
        "label_disagreement": (
            (disagreement > cfg.max_cell_disagreement) | (gap_error > cfg.max_lead_gap_error_m)
        ),
        "logged_event": flag_matrix.any(axis=1),
    }
    for rule in REASONS:
        if not cfg.enabled[rule]:
            fired[rule] = np.zeros(n, dtype=bool)

    scored = context[list(KEYS)].copy()
    scored["timestamp_ns"] = frames["timestamp_ns"].to_numpy(dtype=np.int64)
    for tag in TAGS:
        scored[tag] = context[tag].to_numpy()
    scored["reasons"] = [",".join(rule for rule in REASONS if fired[rule][i]) for i in range(n)]
    scored["confidence"] = confidence
    scored["flip_count"] = flips
    scored["disagreement"] = disagreement
    scored["lead_gap_error_m"] = gap_error
    scored["events"] = [
        ",".join(sorted(r for r, hit in zip(event_rules, row, strict=True) if hit))
        for row in flag_matrix
    ]
    return scored[list(BADCASE_COLUMNS)]


def _label_errors(
    occupied: np.ndarray,
    predictions: Predictions,
    labels: tuple[np.ndarray, np.ndarray] | None,
    spec: PerceptionSpec,
) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: the share of occupancy cells that disagree with the auto-label, and the
    lead-gap error in metres (NaN without an auto-label: the rule does not apply there)."""
    n = len(occupied)
    if labels is None:
        return np.full(n, np.nan), np.full(n, np.nan)
    label_occupied = np.asarray(labels[0]) >= 0.5
    disagreement = (occupied != label_occupied).reshape(n, -1).mean(axis=1)
    label_gap_m = np.asarray(labels[1], dtype=np.float64) * spec.max_range_m
    gap_error = np.abs(np.asarray(predictions.lead_gap_m, dtype=np.float64) - label_gap_m)
    return disagreement, gap_error


def mine_badcases(
    frames: pd.DataFrame,
    index: pd.DataFrame | None,
    predictions: Predictions,
    labels: tuple[np.ndarray, np.ndarray] | None,
    config: dict[str, Any] | None = None,
    *,
    spec: PerceptionSpec | None = None,
) -> pd.DataFrame:
    """One row per badcase frame (columns :data:`BADCASE_COLUMNS`), in ``frames`` order.

    ``reasons`` lists every rule that fired, comma-separated and sorted; ``events`` the counted
    logged events at that frame. See :func:`score_frames` for the argument contract.
    """
    scored = score_frames(frames, index, predictions, labels, config, spec=spec)
    return scored[scored["reasons"] != ""].reset_index(drop=True)


def _split_counts(values: pd.Series) -> dict[str, int]:
    exploded = values[values != ""].str.split(",").explode()
    return {str(k): int(v) for k, v in exploded.value_counts().sort_index().items()}


def badcase_summary(badcases: pd.DataFrame) -> dict[str, Any]:
    """Counts for asset metadata: total, logs, per slice, per reason, per logged event.

    A frame with two reasons counts once in ``badcases`` and once under each reason, so the
    reason counts may sum to more than the total.
    """
    if badcases.empty:
        return {"badcases": 0, "logs": 0, "per_slice": {}, "per_reason": {}, "per_event": {}}
    per_slice = badcases["slice"].value_counts().sort_index()
    return {
        "badcases": len(badcases),
        "logs": int(badcases["log_id"].nunique()),
        "per_slice": {str(k): int(v) for k, v in per_slice.items()},
        "per_reason": _split_counts(badcases["reasons"]),
        "per_event": _split_counts(badcases["events"].fillna("")),
    }
