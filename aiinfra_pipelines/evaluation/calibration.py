"""The offline gate's error rates, measured through its own code on simulated benchmarks.

Benchmarks shaped like the demo's (24 slices of 15-85 frames, 18 occupancy cells a frame, per
slice error rates and lead-gap errors in the demo's range) are scored for a reference and a
candidate; the tables and per-frame scores go through :func:`.compare.compare_with_production`
exactly as ``offline_eval`` hands them over. A candidate "as good as production" makes its own
mistakes at the same rates (errors of the two correlated through each frame's difficulty, as two
models trained on the same data are); a regressed one loses 0.05 accuracy on one 50-frame slice.
Seeded, so a test can pin the figures.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .compare import compare_with_production
from .frame_scores import FrameScores, PairedFrames
from .slices import evaluate_by_slice

CELLS = (3, 6)  # lanes x distance bins, as the perception contract's grid
MAX_RANGE_M = 75.0
LIGHTINGS, WEATHERS = ("day", "night"), ("clear", "rain", "fog")
ROADS = ("highway", "merge", "roundabout", "intersection")
REGRESSED_SLICE_FRAMES = 50


@dataclass(frozen=True)
class SlicePlan:
    name: str
    frames: int
    cell_error: float  # the reference's share of wrong cells
    gap_error_m: float  # the reference's typical lead-gap error


def demo_like_benchmark(rng: np.random.Generator) -> list[SlicePlan]:
    """24 slices of 15-85 frames (the first exactly 50, the one a regression hits), error
    rates and lead-gap errors spread like the demo's benchmark report."""
    plans = []
    names = [f"{light}/{w}/{r}" for light in LIGHTINGS for w in WEATHERS for r in ROADS]
    for index, name in enumerate(names):
        frames = REGRESSED_SLICE_FRAMES if index == 0 else int(rng.integers(15, 86))
        plans.append(
            SlicePlan(name, frames, float(rng.uniform(0.0, 0.045)), float(rng.uniform(1, 15)))
        )
    return plans


@dataclass
class Benchmark:
    """A simulated benchmark: per frame its slice, difficulty, labels and lead gap."""

    slices: np.ndarray
    difficulty: np.ndarray  # per frame: the share of cells a model gets wrong there
    gap_scale: np.ndarray  # per frame: the lead-gap error scale (m)
    occupied: np.ndarray  # N x 3 x 6 labels
    gap_target: np.ndarray  # normalized

    @classmethod
    def draw(cls, rng: np.random.Generator, plans: list[SlicePlan]) -> Benchmark:
        slices = np.concatenate([[p.name] * p.frames for p in plans])
        error = np.concatenate([np.full(p.frames, p.cell_error) for p in plans])
        # Frames differ in difficulty around their slice's rate (a dark frame, a busy one).
        difficulty = np.clip(error * rng.gamma(2.0, 0.5, size=len(error)), 0.0, 0.5)
        scale = np.concatenate([np.full(p.frames, p.gap_error_m) for p in plans])
        return cls(
            slices=slices,
            difficulty=difficulty,
            gap_scale=scale,
            occupied=(rng.random((len(slices), *CELLS)) < 0.3).astype(np.float64),
            gap_target=rng.uniform(0.1, 0.9, size=len(slices)),
        )

    def frames(self) -> pd.DataFrame:
        return pd.DataFrame({"slice": self.slices})


def predictions(
    benchmark: Benchmark,
    shared: tuple[np.ndarray, np.ndarray],
    rng: np.random.Generator,
    *,
    rho: float,
    extra_error: np.ndarray | None = None,
) -> tuple[pd.DataFrame, FrameScores]:
    """One model's slice table and per-frame scores: a cell is wrong where its latent (the
    frame's shared part with weight ``rho``, the model's own otherwise) falls below the frame's
    difficulty (plus ``extra_error``); the lead-gap error likewise."""
    cell_latent, gap_latent = shared
    own = rng.random(cell_latent.shape)
    mixed = np.where(rng.random(cell_latent.shape) < rho, cell_latent, own)
    difficulty = benchmark.difficulty + (0.0 if extra_error is None else extra_error)
    wrong = mixed < difficulty[:, None, None]
    predicted = np.where(wrong, 1.0 - benchmark.occupied, benchmark.occupied)
    gap_noise = np.sqrt(rho) * gap_latent + np.sqrt(1 - rho) * rng.standard_normal(len(gap_latent))
    gap_pred = benchmark.gap_target + gap_noise * benchmark.gap_scale / MAX_RANGE_M
    frames = benchmark.frames()
    table = evaluate_by_slice(
        frames, predicted, benchmark.occupied, gap_pred, benchmark.gap_target, MAX_RANGE_M
    )
    return table, FrameScores.of(
        predicted, benchmark.occupied, gap_pred, benchmark.gap_target, MAX_RANGE_M
    )


def _rng(*parts: Any) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def offline_trial(
    trial: int, gates: Mapping[str, Any], *, regressed: bool, rho: float = 0.5
) -> bool:
    """Whether the offline gate certifies one simulated candidate against production."""
    benchmark = Benchmark.draw(_rng(trial, "benchmark"), demo_like_benchmark(_rng(trial, "plan")))
    n = len(benchmark.slices)
    latent_rng = _rng(trial, "frames")
    shared = (latent_rng.random((n, *CELLS)), latent_rng.standard_normal(n))
    production, production_scores = predictions(benchmark, shared, _rng(trial, "ref"), rho=rho)
    extra = None
    if regressed:
        extra = np.where(benchmark.slices == benchmark.slices[0], 0.05, 0.0)
    candidate, candidate_scores = predictions(
        benchmark, shared, _rng(trial, "cand", regressed), rho=rho, extra_error=extra
    )
    evidence = PairedFrames(benchmark.slices, candidate_scores, production_scores)
    return compare_with_production(candidate, production, gates, evidence=evidence).passed


def calibrate_offline(trials: int, gates: Mapping[str, Any], *, seed: int = 0) -> dict[str, Any]:
    """``offline_aa_certified`` (a candidate as good as production, certified) and
    ``offline_slice_regression_refused`` (one 50-frame slice 0.05 less accurate, refused),
    with their Monte Carlo standard errors."""
    certified = sum(
        offline_trial(seed * 100_003 + t, gates, regressed=False) for t in range(trials)
    )
    refused = sum(
        not offline_trial(seed * 100_003 + t, gates, regressed=True) for t in range(trials)
    )
    result: dict[str, Any] = {}
    for name, count in (
        ("offline_aa_certified", certified),
        ("offline_slice_regression_refused", refused),
    ):
        share = count / trials
        result[name] = round(share, 4)
        result[f"{name}_se"] = round(float(np.sqrt(share * (1 - share) / trials)), 4)
    result["offline_trials"] = trials
    return result


def offline_targets(gates: Mapping[str, Any]) -> dict[str, float]:
    """The offline figures' targets as gates.yaml states them beside the offline gate."""
    offline = gates.get("offline", gates)
    found = {**(offline.get("false_refusal") or {}), **(offline.get("must_catch") or {})}
    return {str(name): float(value) for name, value in found.items()}
