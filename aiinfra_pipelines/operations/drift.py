"""Input and confidence drift of the recent fleet against the data the engine was trained on.

Per frame, cheap camera statistics (brightness, contrast, sharpness, saturation) describe the
input distribution: night darkens, fog flattens contrast, rain blurs. The deployed engine's
per-frame confidence describes how familiar the inputs look to the model. The recent fleet
window is compared with a sample of the latest training dataset, signal by signal, with the
population stability index over the reference's quantile bins and the two-sample KS
statistic; any signal beyond its threshold (``operations.yaml``) makes the verdict "drifted",
which the retraining sensor reads from ``operations/drift/latest.json``.

The verdict's ``id`` is a hash of what was compared (dataset version, recent logs, engine), so
the same situation always has the same id and a retraining run key built from it never
launches twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.shadow import histogram, ks_statistic, psi

DRIFT_PREFIX = "operations/drift/"
LATEST_DRIFT_KEY = f"{DRIFT_PREFIX}latest.json"
IMAGE_STATISTICS = ("brightness", "contrast", "sharpness", "saturation")


@dataclass(frozen=True)
class DriftSettings:
    """``resources/operations.yaml`` → ``drift``."""

    max_logs: int
    max_age_days: float
    reference_samples: int
    recent_samples: int
    min_samples: int
    seed: int
    bins: int
    min_bin_width: float
    psi_threshold: float
    ks_threshold: float
    image_statistics: tuple[str, ...]
    telemetry_batches: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DriftSettings:
        section = settings_section("operations.yaml", "drift", config)
        statistics = tuple(str(name) for name in section.list("image_statistics"))
        unknown = sorted(set(statistics) - set(IMAGE_STATISTICS))
        if unknown:
            raise section.error(
                "image_statistics", f"unknown statistic(s) {unknown}; known: {IMAGE_STATISTICS}"
            )
        window = section.section("window")
        return cls(
            max_logs=window.int("max_logs"),
            max_age_days=window.float("max_age_days"),
            reference_samples=section.int("reference_samples"),
            recent_samples=section.int("recent_samples"),
            min_samples=section.int("min_samples"),
            seed=section.int("seed"),
            bins=section.int("bins"),
            min_bin_width=section.float("min_bin_width"),
            psi_threshold=section.float("psi_threshold"),
            ks_threshold=section.float("ks_threshold"),
            image_statistics=statistics,
            telemetry_batches=section.int("telemetry_batches"),
        )


def drift_record_key(verdict_id: str) -> str:
    return f"{DRIFT_PREFIX}{verdict_id}.json"


def image_statistics(images: np.ndarray) -> pd.DataFrame:
    """Per-frame statistics of uint8 N×H×W×3 images, each scaled to [0, 1].

    brightness: mean gray level; contrast: gray standard deviation; sharpness: mean absolute
    horizontal + vertical gray gradient; saturation: mean per-pixel channel spread.
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected N x H x W x 3 images, got shape {images.shape}")
    pixels = images.astype(np.float32) / 255.0
    gray = pixels.mean(axis=3)
    gradient = np.abs(np.diff(gray, axis=2)).mean(axis=(1, 2)) + np.abs(np.diff(gray, axis=1)).mean(
        axis=(1, 2)
    )
    return pd.DataFrame(
        {
            "brightness": gray.mean(axis=(1, 2)),
            "contrast": gray.std(axis=(1, 2)),
            "sharpness": gradient,
            "saturation": (pixels.max(axis=3) - pixels.min(axis=3)).mean(axis=(1, 2)),
        }
    ).astype("float64")


def quantile_edges(reference: np.ndarray, bins: int, min_width: float) -> np.ndarray:
    """Bin edges at the reference's quantiles, open at both ends, no two closer than
    ``min_width``, with edges just outside the reference's range.

    Pure quantile bins over a near-constant signal (one camera, one road) are slivers a
    thousandth wide, and PSI then measures noise; merging them to a meaningful resolution and
    fencing the reference's range keeps PSI near 0 for the same distribution and still puts
    a shifted one into bins the reference left empty.
    """
    quantiles = np.quantile(reference, np.linspace(0.0, 1.0, bins + 1)[1:-1])
    candidates = np.sort(
        np.concatenate([[reference.min() - min_width], quantiles, [reference.max() + min_width]])
    )
    kept = [candidates[0]]
    for edge in candidates[1:]:
        if edge - kept[-1] >= min_width:
            kept.append(edge)
    return np.concatenate([[-np.inf], kept, [np.inf]])


def signal_drift(
    reference: np.ndarray, recent: np.ndarray, settings: DriftSettings
) -> dict[str, Any]:
    """PSI and KS of one signal, and whether either crosses its threshold."""
    reference = np.asarray(reference, dtype=float)
    recent = np.asarray(recent, dtype=float)
    edges = quantile_edges(reference, settings.bins, settings.min_bin_width)
    psi_value = psi(histogram(reference, edges), histogram(recent, edges))
    ks_value = ks_statistic(reference, recent)
    return {
        "psi": round(psi_value, 6),
        "ks": round(ks_value, 6),
        "reference_mean": round(float(reference.mean()), 6),
        "recent_mean": round(float(recent.mean()), 6),
        "drifted": bool(psi_value > settings.psi_threshold or ks_value > settings.ks_threshold),
    }


def histogram_drift(
    reference_counts: Sequence[int], recent_counts: Sequence[int], settings: DriftSettings
) -> dict[str, Any]:
    """PSI of two histograms over the same bins (telemetry carries histograms, not samples)."""
    value = psi(np.asarray(reference_counts), np.asarray(recent_counts))
    return {"psi": round(value, 6), "drifted": bool(value > settings.psi_threshold)}


def verdict_id(parts: Mapping[str, Any]) -> str:
    """A stable id of what a verdict compared (same inputs → same id)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def drift_verdict(
    reference: pd.DataFrame,
    recent: pd.DataFrame,
    settings: DriftSettings,
    *,
    identity: Mapping[str, Any],
    histograms: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
) -> dict[str, Any]:
    """The verdict over every configured signal present in both tables (+ histogram signals).

    ``reference`` and ``recent`` hold one row per frame with the image statistics and
    ``confidence``; ``histograms`` maps extra signal names to (reference, recent) counts.
    With fewer than ``min_samples`` frames on either side the verdict is "insufficient" and
    never "drifted": too little data to tell drift from noise.
    """
    signals = [*settings.image_statistics, "confidence"]
    base = {
        "id": verdict_id(identity),
        "identity": dict(identity),
        "reference_frames": len(reference),
        "recent_frames": len(recent),
        "thresholds": {"psi": settings.psi_threshold, "ks": settings.ks_threshold},
    }
    if min(len(reference), len(recent)) < settings.min_samples:
        return {
            **base,
            "drifted": False,
            "insufficient": True,
            "signals": [],
            "metrics": {},
            "reason": (
                f"{len(reference)} reference and {len(recent)} recent frames; at least "
                f"{settings.min_samples} each are needed"
            ),
        }
    metrics = {
        name: signal_drift(reference[name].to_numpy(), recent[name].to_numpy(), settings)
        for name in signals
        if name in reference.columns and name in recent.columns
    }
    for name, (reference_counts, recent_counts) in (histograms or {}).items():
        if sum(reference_counts) and sum(recent_counts):
            metrics[name] = histogram_drift(reference_counts, recent_counts, settings)
    drifted = sorted(name for name, values in metrics.items() if values["drifted"])
    return {
        **base,
        "drifted": bool(drifted),
        "insufficient": False,
        "signals": drifted,
        "metrics": metrics,
        "reason": (
            f"drift in {', '.join(drifted)}" if drifted else "every signal within thresholds"
        ),
    }


def latest_drift_verdict(lake: VersionedLake) -> dict | None:
    """The newest ``drift_monitor`` verdict on main (``{"id", "drifted", "signals", ...}``)."""
    return lake.get_json_or_none(MAIN_BRANCH, LATEST_DRIFT_KEY)
