"""The offline evaluation of one candidate: benchmark metrics vs the reference release.

What ``offline_eval`` computes, without Dagster around it: the frozen benchmark set read from
``main`` (refused when empty: an empty benchmark proves nothing), per-slice metrics of the
candidate and of the reference release, no-camera baselines fitted on the candidate's training
split, and the gate's comparison. MLflow logging (plots, trend) is in :func:`log_offline_eval`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, training_rows_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.reference import reference_release
from aiinfra_pipelines.training.resources import load_registered_network, mlflow_tracking_uri

from .baselines import fit_baselines, scored_baselines
from .compare import Comparison, compare_with_production
from .frame_scores import PairedFrames
from .predict import scored_slices

PLOTTED_METRICS = ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m")
# What labels are derived from (perception.labels.ground_truth_labels), keyed by frame.
LABEL_COLUMNS = ("log_id", "frame_index", "ground_truth", "lane_index", "lane_count")


@dataclass(frozen=True)
class OfflineEvaluation:
    """The candidate judged on one benchmark version against one reference (or none)."""

    benchmark_version: Any
    candidate: pd.DataFrame
    baseline: pd.DataFrame
    reference: dict[str, Any] | None
    comparison: Comparison

    def to_dict(self, mlflow_run_id: str) -> dict[str, Any]:
        """The ``offline_eval`` output as stored in the lake (the publish gate reads it)."""
        return {
            "passed": self.comparison.passed,
            "failures": self.comparison.failures,
            "notes": self.comparison.notes,
            "has_production": self.comparison.has_production,
            # The release it was judged against (None: a first release, held to the floors).
            "reference_version": self.reference["version"] if self.reference else None,
            "benchmark_version": self.benchmark_version,
            "mlflow_run_id": mlflow_run_id,
            "candidate": self.candidate.to_dict(orient="records"),
            "baseline": self.baseline.to_dict(orient="records"),
            # The rules it was judged under (gate_rules): certification refuses a mix.
            **gate_rules().to_dict(),
        }


def training_label_frames(lake: VersionedLake, trained_model: Mapping[str, Any]) -> pd.DataFrame:
    """The label columns of the candidate's training split (no pixels): what baselines fit on.

    The dataset is read at the commit the model recorded, so the baselines describe exactly
    the data the candidate learned from, even when a newer dataset has landed since.
    """
    commit = trained_model["dataset_commit"]
    rows_key = trained_model.get("dataset_rows_key") or training_rows_key(
        trained_model["dataset_version"]
    )
    rows = lake.get_parquet(commit, rows_key)
    rows = rows[rows["split"] == "train"]
    parts = []
    for frames_object, wanted in rows.groupby("frames_object", sort=True):
        labels = lake.get_parquet(commit, str(frames_object), columns=list(LABEL_COLUMNS))
        parts.append(wanted[["log_id", "frame_index"]].merge(labels, on=["log_id", "frame_index"]))
    if not parts:
        raise ValueError(f"training dataset {trained_model['dataset_version']} has no train rows")
    return pd.concat(parts, ignore_index=True)


def benchmark_frames(lake: VersionedLake) -> tuple[dict[str, Any], pd.DataFrame]:
    """The benchmark manifest and its frames on ``main``; refused when absent or empty."""
    manifest = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if manifest is None:
        raise ValueError("no benchmark_set on main: materialize benchmark_set first")
    rows = lake.get_parquet(MAIN_BRANCH, manifest["frames_key"])
    if rows.empty:
        # Every slice has a single log so far, and a slice's last log always goes to training:
        # there is nothing held out to evaluate on, and an empty benchmark proves nothing.
        raise ValueError(
            f"benchmark set {manifest['version']} holds no frames (uncovered slices: "
            f"{', '.join(manifest.get('uncovered_slices', [])) or 'none listed'}); land more "
            "logs so slices have a log to hold out, then re-run"
        )
    return manifest, load_frames(lake, rows, MAIN_BRANCH)


def evaluate_offline(
    lake: VersionedLake, tracking_uri: str, trained_model: Mapping[str, Any]
) -> OfflineEvaluation:
    """The candidate vs the reference release (the one rolling out, else production)."""
    manifest, frames = benchmark_frames(lake)
    network = load_registered_network(trained_model["model_uri"], tracking_uri)
    candidate, candidate_scores = scored_slices(network, frames)
    reference = reference_release(lake, excluding=trained_model["model_version"])
    production, reference_scores = (
        scored_slices(load_registered_network(reference["model_uri"], tracking_uri), frames)
        if reference and reference.get("model_uri")
        else (None, None)
    )
    # No-camera baselines fitted on the candidate's training split, scored on this benchmark:
    # reported always, and the floors a first release must clear (gates.yaml first_release).
    baselines = fit_baselines(training_label_frames(lake, trained_model))
    baseline, baseline_scores = scored_baselines(baselines, frames)
    slices = frames["slice"].astype(str).to_numpy()
    evidence = PairedFrames(
        slices,
        candidate_scores,
        baseline_scores if reference_scores is None else reference_scores,
    )
    comparison = compare_with_production(
        candidate,
        production,
        load_resource_yaml("gates.yaml"),
        baseline=baseline,
        evidence=evidence,
    )
    return OfflineEvaluation(manifest["version"], candidate, baseline, reference, comparison)


def log_offline_eval(
    tracking_uri: str, trained_model: Mapping[str, Any], evaluation: OfflineEvaluation
) -> str:
    """Plots, comparison and the metric × slice × version trend on the candidate's MLflow run;
    returns the trend as markdown (for the asset's metadata)."""
    import mlflow  # heavy imports stay out of the code location's import path

    from .plots import slice_metric_plot
    from .trend import (
        TREND_ARTIFACT,
        earlier_records,
        slice_trend,
        trend_markdown,
        trend_plot,
        trend_record,
    )

    comparison, candidate = evaluation.comparison, evaluation.candidate
    version = trained_model["model_version"]
    with mlflow_tracking_uri(tracking_uri), mlflow.start_run(run_id=trained_model["mlflow_run_id"]):
        for metric in PLOTTED_METRICS:
            mlflow.log_figure(
                slice_metric_plot(comparison.table, metric), f"offline_eval/{metric}.png"
            )
        mlflow.log_text(comparison.to_markdown(), "offline_eval/comparison.md")
        # Metric x slice x version: this candidate beside every earlier registered version.
        record = trend_record(version, evaluation.benchmark_version, candidate)
        mlflow.log_dict(record, TREND_ARTIFACT)
        earlier = earlier_records(tracking_uri, trained_model["registered_model"], version)
        trend = slice_trend([*earlier, record], PLOTTED_METRICS)
        trend_md = "\n".join(trend_markdown(trend, metric) for metric in PLOTTED_METRICS)
        mlflow.log_text(trend_md, "offline_eval/trend.md")
        for metric in PLOTTED_METRICS:
            mlflow.log_figure(trend_plot(trend, metric), f"offline_eval/trend_{metric}.png")
        overall = candidate[candidate["slice"] == "overall"].iloc[0]
        mlflow.log_metrics({f"benchmark_{m}": float(overall[m]) for m in PLOTTED_METRICS})
    return trend_md


def offline_eval_metadata(evaluation: OfflineEvaluation, trend_md: str) -> dict[str, Any]:
    """``offline_eval``'s metadata: verdict, comparison, baselines and the slice trend."""
    reference = evaluation.reference
    baseline_overall = evaluation.baseline[evaluation.baseline["slice"] == "overall"].iloc[0]
    overall = evaluation.candidate[evaluation.candidate["slice"] == "overall"]
    # The candidate's headline figures as numbers (the UI plots numeric metadata across
    # materializations; inside the comparison's Markdown they could only be read).
    headline = (
        {f"candidate_{m}": float(overall.iloc[0][m]) for m in PLOTTED_METRICS}
        if len(overall)
        else {}
    )
    return {
        **headline,
        "passed": evaluation.comparison.passed,
        "failures": dg.MetadataValue.json(evaluation.comparison.failures),
        "benchmark_version": evaluation.benchmark_version,
        "production": reference["version"] if reference else "none yet",
        "reference_source": reference["source"] if reference else "none",
        "comparison": dg.MetadataValue.md(evaluation.comparison.to_markdown()),
        "baseline_accuracy": float(baseline_overall["occupancy_accuracy"]),
        "baseline_lead_gap_mae_m": float(baseline_overall["lead_gap_mae_m"]),
        "slice_trend": dg.MetadataValue.md(trend_md),
    }
