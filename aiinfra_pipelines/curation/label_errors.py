"""Suspected label errors by confident learning on out-of-fold predictions (numpy only).

Why out-of-fold: a model scored on frames it was fitted to agrees with their labels, wrong
ones included. So frames are cross-fitted in K folds and every frame's probabilities come
from a model that never saw it. Folds are cut **by log**: frames of one drive are nearly
copies of each other, and a model that saw frame 10 of a log would "predict" frame 11's label
from memory, not from what the image shows.

The model is deliberately simple — multi-output logistic regression on (PCA-reduced,
standardized) per-frame features, one output per occupancy cell — because confident learning
needs calibrated-enough probabilities, not a good detector, and it must run in seconds.

Confident learning (Northcutt et al., 2021), per cell, classes {free, occupied}:

* per-class threshold ``t_k`` = mean predicted probability of class ``k`` over the frames
  *given* label ``k`` (the model's typical self-confidence on that class);
* a frame counts as confidently class ``j`` when ``p_j >= t_j`` (the most probable such ``j``
  when both pass); tallying given × confident labels is the confident joint;
* calibrated to the given-label counts, its off-diagonal share estimates how many given-``i``
  labels are truly ``j``; that many given-``i`` frames with the largest normalized margin
  ``p_j - p_i`` are the suspected errors ("prune by noise rate"), ranked by that margin.

Written from the paper, not from cleanlab (whose licence is not ours).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

_EPS = 1e-6


@dataclass(frozen=True)
class CrossFitSettings:
    """How the out-of-fold model is fitted (values come from ``datasets.yaml`` data_health)."""

    folds: int
    components: int  # PCA dimensions the features are reduced to (0: keep all)
    l2: float  # ridge penalty of the logistic regression
    iterations: int  # accelerated gradient steps per fold
    seed: int

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ValueError(f"cross-fitting needs at least 2 folds, got {self.folds}")
        if self.components < 0 or self.iterations < 1 or self.l2 < 0:
            raise ValueError(f"invalid cross-fit settings: {self}")


def log_folds(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold number per row such that all rows of a group (a log) share one fold.

    Largest logs first, each to the currently smallest fold (ties broken by a seeded hash of
    the log id), so folds hold similar frame counts and the assignment is deterministic.
    """
    names, inverse, sizes = np.unique(
        np.asarray(groups).astype(str), return_inverse=True, return_counts=True
    )
    if len(names) < folds:
        raise ValueError(
            f"{len(names)} log(s) cannot be cut into {folds} folds by log: "
            "lower data_health.label_errors.folds or add logs"
        )
    tiebreak = [hashlib.sha256(f"{seed}:{name}".encode()).hexdigest() for name in names]
    order = sorted(range(len(names)), key=lambda i: (-sizes[i], tiebreak[i]))
    load = np.zeros(folds, dtype=np.int64)
    fold_of = np.empty(len(names), dtype=np.int64)
    for i in order:
        fold = int(np.argmin(load))
        fold_of[i] = fold
        load[fold] += sizes[i]
    return fold_of[inverse]


def _reduce(features: np.ndarray, components: int) -> np.ndarray:
    """Standardized features, projected on their leading principal components.

    Unsupervised (no label is read), so fitting it on every frame leaks no label across folds.
    """
    centred = features - features.mean(axis=0)
    scale = centred.std(axis=0)
    centred = centred / np.where(scale > _EPS, scale, 1.0)
    if components and components < min(centred.shape):
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        centred = centred @ vt[:components].T
        centred /= np.maximum(centred.std(axis=0), _EPS)
    return centred


def fit_logistic(
    features: np.ndarray, labels: np.ndarray, l2: float, iterations: int
) -> tuple[np.ndarray, np.ndarray]:
    """(weights d x C, bias C) of independent L2-regularized logistic regressions, one per
    label column, by Nesterov-accelerated gradient descent with the Lipschitz step size."""
    n, d = features.shape
    step = 1.0 / (np.linalg.norm(features, 2) ** 2 / (4.0 * n) + 0.25 + l2)
    weights = np.zeros((d, labels.shape[1]))
    prior = labels.mean(axis=0).clip(_EPS, 1 - _EPS)
    bias = np.log(prior / (1 - prior))
    previous_w, previous_b = weights, bias
    for k in range(1, iterations + 1):
        momentum = (k - 1) / (k + 2)
        look_w = weights + momentum * (weights - previous_w)
        look_b = bias + momentum * (bias - previous_b)
        error = _sigmoid(features @ look_w + look_b) - labels
        previous_w, previous_b = weights, bias
        weights = look_w - step * (features.T @ error / n + l2 * look_w)
        bias = look_b - step * error.mean(axis=0)
    return weights, bias


def _sigmoid(values: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(values, -30.0, 30.0)))


def out_of_fold_probabilities(
    features: np.ndarray, labels: np.ndarray, groups: np.ndarray, settings: CrossFitSettings
) -> np.ndarray:
    """P(label = 1) per row and label column, each from a model fitted without the row's log."""
    features = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if features.ndim != 2 or labels.ndim != 2 or len(features) != len(labels):
        raise ValueError(
            f"features (n x d) and labels (n x cells) must align: {features.shape} vs "
            f"{labels.shape}"
        )
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError("labels must be binary (0 or 1)")
    reduced = _reduce(features, settings.components)
    fold = log_folds(groups, settings.folds, settings.seed)
    probabilities = np.empty_like(labels)
    for k in range(settings.folds):
        held = fold == k
        weights, bias = fit_logistic(
            reduced[~held], labels[~held], settings.l2, settings.iterations
        )
        probabilities[held] = _sigmoid(reduced[held] @ weights + bias)
    return probabilities


@dataclass(frozen=True)
class ConfidentLearning:
    """Per row and label column: flagged as an issue, and the normalized margin against the
    given label (``p_suspected - p_given``); ``joint`` is columns x given x confident."""

    issues: np.ndarray  # bool n x C
    margin: np.ndarray  # float n x C
    joint: np.ndarray  # int C x 2 x 2
    thresholds: np.ndarray  # float C x 2 (nan: class never given)


def confident_learning(probabilities: np.ndarray, labels: np.ndarray) -> ConfidentLearning:
    """Confident joint per binary label column, then prune by noise rate (module docstring)."""
    p1 = np.asarray(probabilities, dtype=np.float64)
    given = np.asarray(labels).astype(np.int64)
    per_class = np.stack([1.0 - p1, p1], axis=-1)  # n x C x 2
    thresholds = np.full((p1.shape[1], 2), np.nan)
    for k in (0, 1):
        mask = given == k
        count = mask.sum(axis=0)
        total = np.where(mask, per_class[..., k], 0.0).sum(axis=0)
        thresholds[:, k] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    confident = per_class >= np.where(np.isnan(thresholds), np.inf, thresholds)[None]
    confident_label = np.where(confident, per_class, -1.0).argmax(axis=-1)
    counted = confident.any(axis=-1)
    joint = np.zeros((p1.shape[1], 2, 2), dtype=np.int64)
    for i in (0, 1):
        for j in (0, 1):
            joint[:, i, j] = (counted & (given == i) & (confident_label == j)).sum(axis=0)
    p_given = np.take_along_axis(per_class, given[..., None], axis=-1)[..., 0]
    margin = (1.0 - p_given) - p_given
    return ConfidentLearning(_prune_by_noise_rate(joint, given, margin), margin, joint, thresholds)


def _prune_by_noise_rate(joint: np.ndarray, given: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """Per column and given label ``i``: the calibrated joint's share of given-``i`` frames
    that are truly ``j`` estimates how many labels are wrong; that many given-``i`` frames with
    the largest margin ``p_j - p_i`` are the issues (cleanlab's default, ``prune_by_noise_rate``:
    frames that were confident in no class still count, unlike the joint's off-diagonal)."""
    issues = np.zeros(given.shape, dtype=bool)
    for column in range(given.shape[1]):
        for i in (0, 1):
            rows = np.flatnonzero(given[:, column] == i)
            counted = joint[column, i].sum()
            if counted == 0:
                continue
            wrong = round(joint[column, i, 1 - i] / counted * len(rows))
            if wrong:
                order = np.argsort(-margin[rows, column], kind="stable")[:wrong]
                issues[rows[order], column] = True
    return issues


def ranked_label_errors(
    result: ConfidentLearning, labels: np.ndarray, cell_names: list[str]
) -> pd.DataFrame:
    """One row per frame with a suspected error, most suspicious first.

    Columns: ``row`` (index into the inputs), ``cells``, ``given``, ``suspected`` (the
    flagged cells in descending margin, comma-separated), ``score`` (the largest margin).
    """
    if len(cell_names) != result.issues.shape[1]:
        raise ValueError(f"{len(cell_names)} cell names for {result.issues.shape[1]} columns")
    given = np.asarray(labels).astype(bool)
    records = []
    for row in np.flatnonzero(result.issues.any(axis=1)):
        cells = np.flatnonzero(result.issues[row])
        cells = cells[np.argsort(-result.margin[row, cells], kind="stable")]
        records.append(
            {
                "row": int(row),
                "cells": ", ".join(cell_names[c] for c in cells),
                "given": ", ".join(_label_name(given[row, c]) for c in cells),
                "suspected": ", ".join(_label_name(not given[row, c]) for c in cells),
                "score": round(float(result.margin[row, cells[0]]), 4),
            }
        )
    table = pd.DataFrame(records, columns=["row", "cells", "given", "suspected", "score"])
    return table.sort_values(["score", "row"], ascending=[False, True]).reset_index(drop=True)


def _label_name(occupied: bool) -> str:
    return "occupied" if occupied else "free"


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged); ``nan`` with one class only."""
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclass(frozen=True)
class LabelErrorReport:
    """What the label-error check shows: the ranked table and the numbers it is judged by."""

    table: pd.DataFrame  # ranked_label_errors over judged cells (``row`` indexes the inputs)
    cell_auc: dict[str, float]  # out-of-fold ROC AUC per cell (nan: one class only)
    judged_cells: list[str]  # cells whose AUC reaches the minimum
    suspected_labels: int  # (frame, cell) labels suspected, judged cells only
    judged_labels: int  # frames x judged cells

    @property
    def rate(self) -> float:
        """Suspected share of the judged labels (0 when nothing could be judged)."""
        return self.suspected_labels / self.judged_labels if self.judged_labels else 0.0


def find_label_errors(
    features: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    cell_names: list[str],
    settings: CrossFitSettings,
    *,
    min_cell_auc: float,
    min_margin: float,
) -> LabelErrorReport:
    """Cross-fit, confident learning, then keep what the evidence supports: cells the
    out-of-fold model separates (AUC >= ``min_cell_auc``) and suspicions whose normalized
    margin reaches ``min_margin``."""
    probabilities = out_of_fold_probabilities(features, labels, groups, settings)
    result = confident_learning(probabilities, labels)
    auc = np.array([roc_auc(probabilities[:, c], labels[:, c]) for c in range(labels.shape[1])])
    judged = np.nan_to_num(auc, nan=0.0) >= min_cell_auc
    suspected = result.issues & (result.margin >= min_margin) & judged[None, :]
    gated = ConfidentLearning(suspected, result.margin, result.joint, result.thresholds)
    return LabelErrorReport(
        table=ranked_label_errors(gated, labels, cell_names),
        cell_auc=dict(zip(cell_names, np.round(auc, 4).tolist(), strict=True)),
        judged_cells=[name for name, ok in zip(cell_names, judged, strict=True) if ok],
        suspected_labels=int(suspected.sum()),
        judged_labels=int(len(labels) * judged.sum()),
    )
