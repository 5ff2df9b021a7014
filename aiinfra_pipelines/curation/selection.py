"""Budgeted selection: which mined candidate frames to label and train on when not all fit.

A label/training budget is spent greedily, one pick at a time. Every pick takes the eligible
candidate with the highest priority

    priority = (1 - diversity_weight) * uncertainty + diversity_weight * novelty

* **uncertainty** blends two estimates, each turned into a percentile rank among the
  candidates (their scales differ; ranks make the weights mean what they say):
  the deployed engine's own confidence (``1 - confidence``: the single model is unsure) and
  the **disagreement of a bootstrap ensemble** of ridge-regression heads fitted on the training
  set's embeddings → labels. Each member sees a different bootstrap resample of the training
  frames, so the members agree where the training data pin the head down and disagree on frames
  whose embeddings lie where the training set says little — an estimate of the epistemic
  (model) uncertainty a single model's softmax confidence cannot give: a network can be
  confidently wrong far from its data. It is a last-layer deep-ensemble/bootstrap estimate: the
  members share the deployed engine's features (one forward pass per frame, already paid for by
  mining) and differ in the head. The engine's mirrored second view was rejected as the second
  opinion: it is one set of weights read twice (test-time augmentation), not an ensemble.
* **novelty** is greedy k-center: the candidate's distance to its nearest frame already in the
  training set *or already chosen*, divided by the largest such distance among the eligible
  candidates. Seeding it with the training set's embeddings is what makes a frame that looks
  like a thousand frames the model trained on worth little, and updating it after each pick is
  what keeps the budget from being spent on fifty near-copies of one hard scene.

Two constraints shape the greedy order:

* **slice quotas**: while a slice holds fewer chosen frames than its quota only such slices
  are eligible, the least filled first (round-robin: every slice gets a pick before any gets
  a second, so quotas that add up to more than the budget still reach the rarest slice).
  A quota is the larger of a floor (``min_slice_share`` × budget: a rare slice
  is never crowded out by a common one) and the slice's share of ``weak_slice_share`` × budget
  in proportion to its **weakness**: the deployed engine's mean error on the slice's candidates
  against their auto-labels (the mined ``disagreement``, the share of occupancy cells it got
  wrong), or its mean uncertainty where no label error is known. Per-frame scores cannot see
  that a slice is weak as a whole — a weak slice's frames compete with every other slice's
  uncertain frames one by one, and random sampling gives it only its share of the pool; the
  budget goes where the model is measurably worst. A third term, **coverage**, water-fills
  ``coverage_share`` × budget over the slices' training-set frame counts: one frame at a time
  to the slice that has the fewest frames in training (counting those already given), so a
  slice the training set lacks entirely is brought up first. Benchmarks kept showing the worst
  slice to be one the training set barely held (``benchmarks/selection.py``), which neither
  a pool-wide draw nor the pool's label error targets: a slice can look easy on its few pool
  frames and still be the one the model has seen least. Quotas are capped by what a slice has;
* **whole-clip context**: a chosen frame brings the candidates of the same log within
  ``clip_radius`` frames (nearest first), counted against the budget: a labeller and the
  temporal rules see the scene around the hard moment, not an isolated frame.

Ties are broken by a seeded permutation, so a selection is a pure function of its inputs and
the seed — which the training dataset and the retraining sensor rely on to agree.
Plain numpy/pandas: no lake, no Dagster.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

FRAME_KEY = ("log_id", "frame_index")
REASON_QUOTA = "slice_quota"
REASON_SCORE = "score"
REASON_CONTEXT = "clip_context"
SCORE_COLUMNS = (
    "log_id",
    "frame_index",
    "slice",
    "chosen",
    "pick_order",
    "reason",
    "context_of",
    "confidence",
    "ensemble_disagreement",
    "uncertainty",
    "novelty",
    "priority",
)


@dataclass(frozen=True)
class SelectionParams:
    """How a budget is spent (``datasets.yaml`` ``selection``; see module docstring)."""

    budget_frames: int
    confidence_weight: float = 1.0
    disagreement_weight: float = 1.0
    diversity_weight: float = 0.5
    min_slice_share: float = 0.0
    weak_slice_share: float = 0.0
    weakness_baseline: float = 0.0
    coverage_share: float = 0.0
    clip_radius: int = 0
    ensemble_members: int = 8
    ridge: float = 1.0

    def __post_init__(self) -> None:
        problems = [f"{name} must be in [0, 1], got {value}" for name, value in self._shares()]
        problems += [message for broken, message in self._bounds() if broken]
        if problems:
            raise ValueError("invalid selection parameters: " + "; ".join(problems))

    def _shares(self) -> list[tuple[str, float]]:
        """The parameters that are shares, where outside [0, 1]."""
        shares = {
            "diversity_weight": self.diversity_weight,
            "min_slice_share": self.min_slice_share,
            "weak_slice_share": self.weak_slice_share,
            "weakness_baseline": self.weakness_baseline,
            "coverage_share": self.coverage_share,
        }
        return [(name, value) for name, value in shares.items() if not 0.0 <= value <= 1.0]

    def _bounds(self) -> list[tuple[bool, str]]:
        """(violated, message) for every other bound."""
        weights = (self.confidence_weight, self.disagreement_weight)
        return [
            (self.budget_frames < 0, f"budget_frames must be >= 0, got {self.budget_frames}"),
            (min(weights) < 0, "confidence_weight and disagreement_weight must be >= 0"),
            (sum(weights) <= 0, "confidence_weight + disagreement_weight must be > 0"),
            (self.clip_radius < 0, f"clip_radius must be >= 0, got {self.clip_radius}"),
            (
                self.ensemble_members < 2,
                f"ensemble_members must be >= 2, got {self.ensemble_members}",
            ),
            (self.ridge <= 0, f"ridge must be > 0, got {self.ridge}"),
        ]


@dataclass(frozen=True)
class Selection:
    """The chosen candidate rows, a score row per candidate (why it was or was not chosen),
    and a summary for metadata."""

    chosen: pd.DataFrame
    scores: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float64): distances then compare directions, not the
    activation magnitude that differs between a dark and a bright frame of one scene."""
    matrix = np.asarray(embeddings, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array (frames x dims), got {matrix.shape}")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def nearest_distances(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Each point's Euclidean distance to its nearest center (``inf`` with no centers)."""
    if len(centers) == 0:
        return np.full(len(points), np.inf)
    best = np.full(len(points), np.inf)
    for start in range(0, len(centers), 1024):  # bounded memory: points x 1024 at a time
        block = centers[start : start + 1024]
        squared = (points**2).sum(axis=1)[:, None] - 2.0 * points @ block.T + (block**2).sum(axis=1)
        best = np.minimum(best, np.sqrt(np.maximum(squared, 0.0)).min(axis=1))
    return best


def k_center_greedy(embeddings: np.ndarray, covered: np.ndarray | None, k: int) -> list[int]:
    """Indices of ``k`` rows of ``embeddings``, each the farthest from the covered set so far.

    ``covered`` (e.g. the training set's embeddings) seeds the set: a point near it is picked
    late or never. The classic 2-approximation of the k-center problem (Gonzalez 1985), used
    for active learning by Sener & Savarese (2018, "core-set"). Without ``covered`` every
    distance starts infinite and the first pick is row 0.
    """
    points = unit_rows(embeddings)
    seeds = unit_rows(covered) if covered is not None and len(covered) else points[:0]
    distance = nearest_distances(points, seeds)
    chosen: list[int] = []
    for _ in range(min(k, len(points))):
        distance[chosen] = -1.0
        pick = int(np.argmax(distance))
        chosen.append(pick)
        distance = np.minimum(distance, nearest_distances(points, points[pick : pick + 1]))
    return chosen


def ensemble_disagreement(
    train_embeddings: np.ndarray,
    train_targets: np.ndarray,
    candidate_embeddings: np.ndarray,
    *,
    members: int,
    ridge: float,
    seed: int,
) -> np.ndarray:
    """Per candidate: the members' spread (mean over outputs of the standard deviation) of a
    bootstrap ensemble of ridge-regression heads, embeddings → targets (e.g. occupancy cells).

    Closed-form ridge on standardized features: members cost one d x d solve each, so the
    estimate is cheap enough for a sensor tick. Predictions are clipped to [0, 1] (the targets'
    range) before the spread is taken, so a member extrapolating wildly counts as "unsure",
    not as infinitely unsure.
    """
    x = np.asarray(train_embeddings, dtype=np.float64)
    y = np.asarray(train_targets, dtype=np.float64).reshape(len(x), -1)
    if len(x) < 2:
        raise ValueError(f"an ensemble needs at least 2 training frames, got {len(x)}")
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    x = (x - mean) / scale
    candidates = (np.asarray(candidate_embeddings, dtype=np.float64) - mean) / scale
    rng = np.random.default_rng(seed)
    eye = ridge * np.eye(x.shape[1])
    predictions = []
    for _ in range(members):
        rows = rng.integers(0, len(x), size=len(x))
        xb, yb = x[rows], y[rows]
        offset = yb.mean(axis=0)
        weights = np.linalg.solve(xb.T @ xb + eye, xb.T @ (yb - offset))
        predictions.append(np.clip(candidates @ weights + offset, 0.0, 1.0))
    return np.stack(predictions).std(axis=0).mean(axis=1)


def percentile_rank(values: np.ndarray) -> np.ndarray:
    """Each value's rank among ``values`` in [0, 1] (ties share their mean rank)."""
    if len(values) == 0:
        return np.zeros(0)
    if len(values) == 1:
        return np.ones(1)
    ranks = pd.Series(values).rank(method="average").to_numpy()
    return (ranks - 1.0) / (len(values) - 1.0)


def uncertainty_scores(
    confidence: np.ndarray, disagreement: np.ndarray | None, params: SelectionParams
) -> np.ndarray:
    """The weighted mean of the percentile ranks of ``1 - confidence`` and the ensemble's
    disagreement (confidence alone when there is no ensemble estimate)."""
    unsure = percentile_rank(1.0 - np.asarray(confidence, dtype=np.float64))
    if disagreement is None or params.disagreement_weight == 0:
        return unsure
    if params.confidence_weight == 0:
        return percentile_rank(np.asarray(disagreement, dtype=np.float64))
    total = params.confidence_weight + params.disagreement_weight
    return (
        params.confidence_weight * unsure
        + params.disagreement_weight * percentile_rank(np.asarray(disagreement))
    ) / total


def slice_quotas(
    slices: pd.Series,
    budget: int,
    min_share: float,
    weakness: pd.Series | None = None,
    weak_share: float = 0.0,
    baseline: float = 0.0,
    trained: pd.Series | None = None,
    coverage_share: float = 0.0,
) -> dict[str, int]:
    """Minimum chosen frames per slice: the largest of ``ceil(min_share x budget)``, the
    slice's part of ``weak_share x budget`` in proportion to its ``weakness`` (slice → a
    non-negative score) above ``baseline`` x the slices' mean weakness, and its part of
    ``coverage_share x budget`` water-filled over ``trained`` (slice → training frames), capped
    by the slice's candidates. When the quotas add up to more than the budget, they are filled
    in turns (least filled slice first) until it runs out (the budget always wins)."""
    floor = math.ceil(min_share * budget) if min_share > 0 else 0
    counts = slices.astype(str).value_counts()
    if weakness is not None and baseline > 0 and len(weakness):
        weakness = weakness - baseline * float(weakness.astype(np.float64).mean())
    weak = weak_quotas(weakness, budget, weak_share)
    coverage = coverage_quotas(counts, trained, budget, coverage_share)
    return {
        str(name): int(min(max(floor, weak.get(str(name), 0), coverage.get(str(name), 0)), count))
        for name, count in sorted(counts.items())
    }


def coverage_quotas(
    candidates: pd.Series, trained: pd.Series | None, budget: int, coverage_share: float
) -> dict[str, int]:
    """``coverage_share x budget`` frames water-filled over the slices' training frames.

    One frame at a time goes to the slice with the fewest training frames plus frames already
    given (ties: by name), while it has candidates left: max-min fairness over the training
    set's slice counts, the allocation that raises the least-covered slice first.
    ``candidates`` and ``trained`` map slice → frames; a slice absent from ``trained`` has none.
    """
    if trained is None or coverage_share <= 0 or budget <= 0:
        return {}
    total = math.floor(coverage_share * budget + 0.5)
    given = dict.fromkeys((str(name) for name in candidates.index), 0)
    levels = [
        (int(trained.get(name, 0)), str(name))
        for name, count in candidates.items()
        if int(count) > 0
    ]
    heapq.heapify(levels)
    for _ in range(total):
        if not levels:
            break
        level, name = heapq.heappop(levels)
        given[name] += 1
        if given[name] < int(candidates[name]):
            heapq.heappush(levels, (level + 1, name))
    return {name: count for name, count in given.items() if count}


def weak_quotas(weakness: pd.Series | None, budget: int, weak_share: float) -> dict[str, int]:
    """``weak_share x budget`` frames split over slices in proportion to their weakness
    (rounded half up; the budget still bounds the total, see ``slice_quotas``)."""
    if weakness is None or weak_share <= 0 or budget <= 0:
        return {}
    scores = weakness.astype(np.float64).clip(lower=0.0).fillna(0.0)
    total = float(scores.sum())
    if total <= 0:
        return {}
    return {
        str(name): math.floor(weak_share * budget * float(score) / total + 0.5)
        for name, score in scores.items()
    }


def slice_weakness(candidates: pd.DataFrame, uncertainty: np.ndarray) -> tuple[pd.Series, str]:
    """(slice → mean engine error on its candidates, or mean uncertainty; which one it is).

    The error is the mined ``disagreement`` with the auto-labels, when every candidate has one.
    """
    slices = candidates["slice"].astype(str)
    if "disagreement" in candidates.columns and candidates["disagreement"].notna().all():
        errors = candidates["disagreement"].astype(np.float64)
        return errors.groupby(slices).mean(), "label_error"
    return pd.Series(uncertainty, index=candidates.index).groupby(slices).mean(), "uncertainty"


@dataclass
class _Greedy:
    """Mutable state of one greedy pass (kept out of the public functions' signatures)."""

    candidates: pd.DataFrame
    uncertainty: np.ndarray
    points: np.ndarray | None
    distance: np.ndarray | None
    params: SelectionParams
    tie_break: np.ndarray
    quotas: dict[str, int]
    slices: np.ndarray = field(init=False)
    logs: np.ndarray = field(init=False)
    frame_index: np.ndarray = field(init=False)
    chosen: np.ndarray = field(init=False)
    pick_order: np.ndarray = field(init=False)
    reason: np.ndarray = field(init=False)
    context_of: np.ndarray = field(init=False)
    novelty: np.ndarray = field(init=False)
    priority: np.ndarray = field(init=False)
    picked: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.candidates)
        self.slices = self.candidates["slice"].astype(str).to_numpy()
        self.logs = self.candidates["log_id"].astype(str).to_numpy()
        self.frame_index = self.candidates["frame_index"].to_numpy(dtype=np.int64)
        self.chosen = np.zeros(n, dtype=bool)
        self.pick_order = np.full(n, -1, dtype=np.int64)
        self.reason = np.full(n, "", dtype=object)
        self.context_of = np.full(n, "", dtype=object)
        self.novelty = np.full(n, np.nan)
        self.priority = np.full(n, np.nan)
        self.picked = dict.fromkeys(self.quotas, 0)

    def eligible(self) -> tuple[np.ndarray, bool]:
        """(mask of candidates that may be picked next, whether a quota restricts it).

        Slices below their quota take turns: only those least filled (picked / quota) are
        eligible. When the quotas add up to more than the budget — many slices, or clip
        context taking several frames per pick — filling them in priority order would spend
        the budget before the last slices got any, and the last are the rarest: exactly the
        slices a floor exists for.
        """
        free = ~self.chosen
        # A quota never exceeds its slice's candidates, so a slice below it has free ones: no
        # per-slice scan on every pick (the mask check below only guards that invariant).
        fill = {
            name: self.picked[name] / quota
            for name, quota in self.quotas.items()
            if self.picked[name] < quota
        }
        if fill:
            least = min(fill.values())
            turn = [name for name, ratio in fill.items() if ratio == least]
            restricted = free & np.isin(self.slices, turn)
            if restricted.any():
                return restricted, True
        return free, False

    def current_novelty(self, mask: np.ndarray) -> np.ndarray:
        """Distance to the covered set over the largest among ``mask`` (1.0 where none)."""
        if self.distance is None:
            return np.zeros(len(mask))
        distance = self.distance.copy()
        finite = distance[mask][np.isfinite(distance[mask])]
        top = float(finite.max()) if len(finite) else 0.0
        distance[~np.isfinite(distance)] = top if top > 0 else 1.0
        return distance / top if top > 0 else np.ones(len(distance))

    def pick(self, order: int, budget_left: int) -> int:
        """Choose the next frame and its clip context; the number of frames taken."""
        mask, by_quota = self.eligible()
        novelty = self.current_novelty(mask)
        weight = self.params.diversity_weight if self.distance is not None else 0.0
        priority = (1.0 - weight) * self.uncertainty + weight * novelty
        ranked = np.lexsort((self.tie_break, -priority))
        best = int(ranked[mask[ranked]][0])
        group = [best, *self.neighbours(best)][:budget_left]
        key = f"{self.logs[best]}#{self.frame_index[best]}"
        for position, index in enumerate(group):
            self.chosen[index] = True
            self.pick_order[index] = order
            self.novelty[index] = novelty[index]
            self.priority[index] = priority[index]
            self.picked[self.slices[index]] = self.picked.get(self.slices[index], 0) + 1
            if position == 0:
                self.reason[index] = REASON_QUOTA if by_quota else REASON_SCORE
            else:
                self.reason[index], self.context_of[index] = REASON_CONTEXT, key
        if self.points is not None and self.distance is not None:
            self.distance = np.minimum(
                self.distance, nearest_distances(self.points, self.points[group])
            )
        return len(group)

    def neighbours(self, index: int) -> list[int]:
        """Unchosen candidates of the same log within ``clip_radius`` frames, nearest first."""
        radius = self.params.clip_radius
        if radius == 0:
            return []
        gap = np.abs(self.frame_index - self.frame_index[index])
        near = np.flatnonzero(
            (self.logs == self.logs[index]) & (gap <= radius) & (gap > 0) & ~self.chosen
        )
        return [int(i) for i in near[np.lexsort((self.frame_index[near], gap[near]))]]


def _check_inputs(
    candidates: pd.DataFrame,
    embeddings: np.ndarray | None,
    train_embeddings: np.ndarray | None,
    train_targets: np.ndarray | None,
) -> None:
    missing = {"log_id", "frame_index", "slice", "confidence"} - set(candidates.columns)
    if missing:
        raise ValueError(f"candidates lack column(s) {sorted(missing)}")
    if candidates.duplicated(list(FRAME_KEY)).any():
        raise ValueError("candidates hold the same (log_id, frame_index) more than once")
    if embeddings is not None and len(embeddings) != len(candidates):
        raise ValueError(
            f"{len(candidates)} candidates but {len(embeddings)} embedding rows (row-aligned)"
        )
    if train_targets is not None and (
        train_embeddings is None or len(train_targets) != len(train_embeddings)
    ):
        raise ValueError("train_targets need row-aligned train_embeddings")


def select_frames(
    candidates: pd.DataFrame,
    params: SelectionParams,
    *,
    seed: int,
    embeddings: np.ndarray | None = None,
    train_embeddings: np.ndarray | None = None,
    train_targets: np.ndarray | None = None,
    train_slices: pd.Series | None = None,
) -> Selection:
    """Spend ``params.budget_frames`` on ``candidates`` (see the module docstring).

    ``candidates`` needs ``log_id``, ``frame_index``, ``slice`` and the engine's ``confidence``;
    ``embeddings`` are row-aligned with it, ``train_embeddings`` (and the training frames'
    flattened label ``train_targets`` for the ensemble) describe what is already trained on;
    ``train_slices`` holds the slice of every training frame (the coverage quotas' counts;
    without it ``coverage_share`` has nothing to fill by and the summary says so).
    Without ``embeddings`` (an engine that exports none) the selection runs on confidence,
    quotas and clip context alone and its summary says so. When every candidate fits in the
    budget all are chosen.
    """
    _check_inputs(candidates, embeddings, train_embeddings, train_targets)
    candidates = candidates.reset_index(drop=True)
    notes: list[str] = []
    points = unit_rows(embeddings) if embeddings is not None else None
    disagreement = None
    if points is None:
        notes.append("no embeddings: uncertainty is the engine's confidence alone, no diversity")
    elif train_targets is not None and train_embeddings is not None and len(train_targets) >= 2:
        disagreement = ensemble_disagreement(
            unit_rows(train_embeddings),
            train_targets,
            points,
            members=params.ensemble_members,
            ridge=params.ridge,
            seed=seed,
        )
    else:
        notes.append("no labelled training embeddings: no ensemble disagreement")
    covered = (
        unit_rows(train_embeddings)
        if train_embeddings is not None and len(train_embeddings)
        else None
    )
    uncertainty = uncertainty_scores(candidates["confidence"].to_numpy(), disagreement, params)
    weakness, weakness_basis = slice_weakness(candidates, uncertainty)
    trained = (
        pd.Series(train_slices).astype(str).value_counts() if train_slices is not None else None
    )
    if trained is None and params.coverage_share > 0:
        notes.append("no training slices given: no coverage quotas")
    state = _Greedy(
        candidates=candidates,
        uncertainty=uncertainty,
        points=points,
        distance=(
            nearest_distances(points, covered if covered is not None else points[:0])
            if points is not None
            else None
        ),
        params=params,
        tie_break=np.random.default_rng(seed).permutation(len(candidates)),
        quotas=slice_quotas(
            candidates["slice"],
            params.budget_frames,
            params.min_slice_share,
            weakness,
            params.weak_slice_share,
            params.weakness_baseline,
            trained,
            params.coverage_share,
        ),
    )
    budget_left, order = min(params.budget_frames, len(candidates)), 0
    while budget_left > 0:
        budget_left -= state.pick(order, budget_left)
        order += 1
    scores = pd.DataFrame(
        {
            "log_id": candidates["log_id"],
            "frame_index": candidates["frame_index"],
            "slice": state.slices,
            "chosen": state.chosen,
            "pick_order": state.pick_order,
            "reason": state.reason,
            "context_of": state.context_of,
            "confidence": candidates["confidence"].to_numpy(dtype=np.float64),
            "ensemble_disagreement": disagreement if disagreement is not None else np.nan,
            "uncertainty": state.uncertainty,
            "novelty": state.novelty,
            "priority": state.priority,
        },
        columns=list(SCORE_COLUMNS),
    )
    chosen = candidates[state.chosen].reset_index(drop=True)
    summary = selection_summary(scores, params, state.quotas, notes)
    summary["slice_weakness"] = {
        "basis": weakness_basis,
        **{str(k): round(float(v), 4) for k, v in weakness.items()},
    }
    if trained is not None:
        summary["trained_per_slice"] = {str(k): int(v) for k, v in sorted(trained.items())}
    return Selection(chosen, scores, {**summary, "uses_embeddings": points is not None})


def selection_summary(
    scores: pd.DataFrame, params: SelectionParams, quotas: dict[str, int], notes: list[str]
) -> dict[str, Any]:
    """Candidates, budget, chosen per slice and per reason, quotas and notes (for metadata)."""
    chosen = scores[scores["chosen"]]
    per_slice = scores.groupby("slice")["chosen"].agg(["size", "sum"])
    return {
        "candidates": len(scores),
        "budget_frames": params.budget_frames,
        "chosen": len(chosen),
        "per_slice": {
            str(name): {"candidates": int(row["size"]), "chosen": int(row["sum"])}
            for name, row in per_slice.iterrows()
        },
        "per_reason": {str(k): int(v) for k, v in chosen["reason"].value_counts().items()},
        "quotas": {name: quota for name, quota in quotas.items() if quota},
        "uses_ensemble": bool(scores["ensemble_disagreement"].notna().any()),
        "notes": notes,
    }
