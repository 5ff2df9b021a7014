"""Evaluation (group ``evaluation``): the candidate against production on the benchmark set.

Both models run on the same frozen ``benchmark_set``; metrics per lighting × weather × road
type slice go into a comparison table, and a blocking check fails the candidate when any gated
slice regresses beyond its budget in ``resources/gates.yaml``. Only then does
``published_model`` put the candidate's record on ``main``.
"""

import io
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST, benchmark_set, read_json_if_exists
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.lake.audits import RequiredAudit, record_audit
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, root_run_id_of
from aiinfra_pipelines.lake.publish_asset import build_publish_asset
from aiinfra_pipelines.release.reference import reference_release
from aiinfra_pipelines.training.assets import trained_model
from aiinfra_pipelines.training.resources import MlflowTracking, mlflow_tracking_uri

from .baselines import fit_baselines, score_baselines
from .compare import compare_with_production
from .predict import predict, slice_metrics

GROUP = "evaluation"
CHECK_NAME = "offline_eval_no_slice_regression"
PLOTTED_METRICS = ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m")
# What labels are derived from (perception.labels.ground_truth_labels), keyed by frame.
LABEL_COLUMNS = ("log_id", "frame_index", "ground_truth", "lane_index", "lane_count")
__all__ = ["offline_eval", "predict", "slice_metrics", "training_label_frames"]


def training_label_frames(lake: VersionedLake, trained_model: dict[str, Any]) -> pd.DataFrame:
    """The label columns of the candidate's training split (no pixels): what baselines fit on.

    The dataset is read at the commit the model recorded, so the baselines describe exactly
    the data the candidate learned from, even when a newer dataset has landed since.
    """
    commit = trained_model["dataset_commit"]
    rows_key = trained_model.get("dataset_rows_key") or (
        f"{DATASETS_PREFIX}training/{trained_model['dataset_version']}/dataset.parquet"
    )
    rows = pd.read_parquet(io.BytesIO(lake.get_object(commit, rows_key)))
    rows = rows[rows["split"] == "train"]
    parts = []
    for frames_object, wanted in rows.groupby("frames_object", sort=True):
        labels = pd.read_parquet(
            io.BytesIO(lake.get_object(commit, str(frames_object))), columns=list(LABEL_COLUMNS)
        )
        parts.append(wanted[["log_id", "frame_index"]].merge(labels, on=["log_id", "frame_index"]))
    if not parts:
        raise ValueError(f"training dataset {trained_model['dataset_version']} has no train rows")
    return pd.concat(parts, ignore_index=True)


def _load_model(model_uri: str, tracking_uri: str) -> Any:
    import mlflow

    with mlflow_tracking_uri(tracking_uri):
        return mlflow.pytorch.load_model(model_uri, map_location="cpu")


@dg.asset(group_name=GROUP, kinds={"pytorch", "mlflow"}, deps=[benchmark_set])
def offline_eval(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    trained_model: dict[str, Any],
) -> dict[str, Any]:
    """Per-slice occupancy accuracy/F1 and lead-gap error, candidate vs production."""
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

    manifest = read_json_if_exists(lake, BENCHMARK_MANIFEST)
    if manifest is None:
        raise ValueError("no benchmark_set on main: materialize benchmark_set first")
    rows = pd.read_parquet(io.BytesIO(lake.get_object(MAIN_BRANCH, manifest["frames_key"])))
    if rows.empty:
        # Every slice has a single log so far, and a slice's last log always goes to training:
        # there is nothing held out to evaluate on, and an empty benchmark proves nothing.
        raise ValueError(
            f"benchmark set {manifest['version']} holds no frames (uncovered slices: "
            f"{', '.join(manifest.get('uncovered_slices', [])) or 'none listed'}); land more "
            "logs so slices have a log to hold out, then re-run"
        )
    frames = load_frames(lake, rows, MAIN_BRANCH)
    candidate = slice_metrics(
        _load_model(trained_model["model_uri"], mlflow_tracking.uri()), frames
    )
    # "Production" for the gate is the reference release: the one rolling out, else production.
    reference = reference_release(lake, excluding=trained_model["model_version"])
    production = (
        slice_metrics(_load_model(reference["model_uri"], mlflow_tracking.uri()), frames)
        if reference and reference.get("model_uri")
        else None
    )
    # No-camera baselines fitted on the candidate's training split, scored on this benchmark:
    # reported always, and the floors a first release must clear (gates.yaml first_release).
    baseline = score_baselines(fit_baselines(training_label_frames(lake, trained_model)), frames)
    comparison = compare_with_production(
        candidate, production, load_resource_yaml("gates.yaml"), baseline=baseline
    )
    baseline_overall = baseline[baseline["slice"] == "overall"].iloc[0]
    markdown = comparison.to_markdown()
    with (
        mlflow_tracking_uri(mlflow_tracking.uri()),
        mlflow.start_run(run_id=trained_model["mlflow_run_id"]),
    ):
        for metric in PLOTTED_METRICS:
            mlflow.log_figure(
                slice_metric_plot(comparison.table, metric), f"offline_eval/{metric}.png"
            )
        mlflow.log_text(markdown, "offline_eval/comparison.md")
        # Metric x slice x version: this candidate beside every earlier registered version.
        record = trend_record(trained_model["model_version"], manifest["version"], candidate)
        mlflow.log_dict(record, TREND_ARTIFACT)
        trend = slice_trend(
            [
                *earlier_records(
                    mlflow_tracking.uri(),
                    trained_model["registered_model"],
                    trained_model["model_version"],
                ),
                record,
            ],
            PLOTTED_METRICS,
        )
        trend_md = "\n".join(trend_markdown(trend, metric) for metric in PLOTTED_METRICS)
        mlflow.log_text(trend_md, "offline_eval/trend.md")
        for metric in PLOTTED_METRICS:
            mlflow.log_figure(trend_plot(trend, metric), f"offline_eval/trend_{metric}.png")
        overall = candidate[candidate["slice"] == "overall"].iloc[0]
        mlflow.log_metrics({f"benchmark_{m}": float(overall[m]) for m in PLOTTED_METRICS})
    context.add_output_metadata(
        {
            "passed": comparison.passed,
            "failures": dg.MetadataValue.json(comparison.failures),
            "benchmark_version": manifest["version"],
            "production": reference["version"] if reference else "none yet",
            "reference_source": reference["source"] if reference else "none",
            "comparison": dg.MetadataValue.md(markdown),
            "baseline_accuracy": float(baseline_overall["occupancy_accuracy"]),
            "baseline_lead_gap_mae_m": float(baseline_overall["lead_gap_mae_m"]),
            "slice_trend": dg.MetadataValue.md(trend_md),
        }
    )
    return {
        "passed": comparison.passed,
        "failures": comparison.failures,
        "notes": comparison.notes,
        "has_production": comparison.has_production,
        # The release it was judged against (None: a first release, held to the floors).
        "reference_version": reference["version"] if reference else None,
        "benchmark_version": manifest["version"],
        "mlflow_run_id": trained_model["mlflow_run_id"],
        "candidate": candidate.to_dict(orient="records"),
        "baseline": baseline.to_dict(orient="records"),
    }


def _audited_key(asset: str) -> str:
    return asset_object_base(dg.AssetKey(asset), None) + ".json"


@dg.asset_check(asset=offline_eval, name=CHECK_NAME, blocking=True)
def offline_eval_no_slice_regression(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, offline_eval: dict[str, Any]
) -> dg.AssetCheckResult:
    """No gated slice may regress beyond its budget against production (gates.yaml)."""
    passed = bool(offline_eval["passed"])
    record_audit(
        lake,
        root_run_id_of(context.run),
        asset="offline_eval",
        check=CHECK_NAME,
        partition=None,
        audited_key=_audited_key("offline_eval"),
        passed=passed,
        dagster_run_id=context.run.run_id,
    )
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "failures": dg.MetadataValue.json(offline_eval["failures"]),
            "notes": dg.MetadataValue.json(offline_eval["notes"]),
        },
    )


published_model = build_publish_asset(
    "published_model",
    group=GROUP,
    deps=[trained_model, offline_eval],
    required_audits=lambda _partition: [
        RequiredAudit("offline_eval", CHECK_NAME, _audited_key("offline_eval"))
    ],
)
