"""One drift measurement: recent fleet frames vs the training data, through the deployed engine.

What ``drift_monitor`` computes, without Dagster around it: both samples' image statistics and
engine confidence, the fleet's own confidence histograms from telemetry of the same engine, and
the verdict ``drift.drift_verdict`` draws from them. Publishing stays with the asset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.datasets.selection import TRAINING_LATEST
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.mining.engine_runner import run_engine_over_frames
from aiinfra_pipelines.perception.contract import decode_images, perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.release.rollout_telemetry import telemetry_publishes
from aiinfra_pipelines.release.shadow import recent_rows

from .drift import DriftSettings, drift_verdict, image_statistics
from .telemetry import TelemetrySettings, confidence_histogram


@dataclass(frozen=True)
class DriftMeasurement:
    """The verdict and what it was drawn from (for the asset's metadata)."""

    verdict: dict[str, Any]
    identity: dict[str, Any]
    reference_frames: int
    current_frames: int

    def to_json_bytes(self) -> bytes:
        """The verdict as published under ``operations/drift/`` (pretty, sorted, newline)."""
        return json_document(self.verdict)


def sample_rows(rows: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """At most ``n`` rows, drawn reproducibly."""
    return rows if len(rows) <= n else rows.sample(n=n, random_state=seed)


def frame_signals(lake: VersionedLake, rows: pd.DataFrame, ref: str, engine) -> pd.DataFrame:
    """Image statistics and the deployed engine's confidence for each row's frame."""
    if rows.empty:
        return pd.DataFrame()
    spec = perception_spec()
    frames = load_frames(lake, rows, ref)
    images = decode_images(list(frames["image"]), spec.image_height, spec.image_width)
    signals = image_statistics(images)
    signals["confidence"] = run_engine_over_frames(engine, frames, spec).confidence
    return signals


def telemetry_confidence(
    lake: VersionedLake, engine_sha256: str, batches: int
) -> tuple[list[int], str | None]:
    """Merged confidence histogram of the newest telemetry from ``engine_sha256``."""
    publishes = telemetry_publishes(lake, limit=batches)
    totals: np.ndarray | None = None
    seen = set()
    for publish in publishes:
        if publish.records_key in seen or not lake.object_exists(
            publish.commit, publish.records_key
        ):
            continue
        seen.add(publish.records_key)
        table = lake.get_parquet(publish.commit, publish.records_key)
        table = table[table["engine_sha256"] == engine_sha256]
        for counts in table["confidence_histogram"]:
            counts = np.asarray(counts, dtype=np.int64)
            totals = counts if totals is None else totals + counts
    commit = publishes[0].commit if publishes else None
    return ([] if totals is None else [int(c) for c in totals]), commit


def measure_drift(lake: VersionedLake) -> DriftMeasurement:
    """Input and confidence drift of recent fleet frames vs the newest training dataset."""
    settings = DriftSettings.load()
    telemetry = TelemetrySettings.load()
    deployed = load_deployed_engine(lake)
    pointer = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    reference_rows = pd.DataFrame()
    if pointer is not None:
        rows = lake.get_parquet(pointer["commit"], pointer["rows_key"])
        reference_rows = sample_rows(rows, settings.reference_samples, settings.seed)
    recent = recent_rows(scene_index_view(lake), settings.max_logs, settings.max_age_days)
    recent_sample = sample_rows(recent, settings.recent_samples, settings.seed)
    reference = (
        frame_signals(lake, reference_rows, pointer["commit"], deployed.engine)
        if pointer
        else pd.DataFrame()
    )
    current = frame_signals(lake, recent_sample, MAIN_BRANCH, deployed.engine)
    histograms = {}
    telemetry_counts, telemetry_commit = telemetry_confidence(
        lake, deployed.engine.sha256, settings.telemetry_batches
    )
    if telemetry_counts and not reference.empty:
        reference_counts = confidence_histogram(
            reference["confidence"].to_numpy(), telemetry.confidence_bins
        )
        histograms["telemetry_confidence"] = (reference_counts, telemetry_counts)
    identity = {
        "dataset_version": pointer["version"] if pointer else None,
        "dataset_commit": pointer["commit"] if pointer else None,
        "recent_logs": sorted(recent["log_id"].unique().tolist()) if len(recent) else [],
        "engine_sha256": deployed.engine.sha256,
        "telemetry_commit": telemetry_commit,
    }
    verdict = drift_verdict(reference, current, settings, identity=identity, histograms=histograms)
    verdict["engine_version"] = deployed.version
    return DriftMeasurement(verdict, identity, len(reference), len(current))
