"""Evaluation (group ``evaluation``): the candidate against production on the benchmark set.

Both models run on the same frozen ``benchmark_set``; metrics per lighting × weather × road
type slice go into a comparison table, and a blocking check fails the candidate when any gated
slice regresses beyond its budget in ``resources/gates.yaml``. Only then does
``published_model`` put the candidate's record on ``main``.
"""

from typing import Any

import dagster as dg

from aiinfra_pipelines.datasets.assets import benchmark_set
from aiinfra_pipelines.lake.audits import RequiredAudit, record_audit
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of
from aiinfra_pipelines.lake.publish_asset import build_publish_asset
from aiinfra_pipelines.training.assets import trained_model
from aiinfra_pipelines.training.resources import MlflowTracking

from .offline import (
    LABEL_COLUMNS,
    PLOTTED_METRICS,
    evaluate_offline,
    log_offline_eval,
    offline_eval_metadata,
    training_label_frames,
)
from .predict import predict, slice_metrics

GROUP = "evaluation"
CHECK_NAME = "offline_eval_no_slice_regression"
__all__ = [
    "LABEL_COLUMNS",
    "PLOTTED_METRICS",
    "offline_eval",
    "predict",
    "slice_metrics",
    "training_label_frames",
]


@dg.asset(group_name=GROUP, kinds={"pytorch", "mlflow"}, deps=[benchmark_set])
def offline_eval(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    trained_model: dict[str, Any],
) -> dict[str, Any]:
    """Per-slice occupancy accuracy/F1 and lead-gap error, candidate vs production."""
    evaluation = evaluate_offline(lake, mlflow_tracking.uri(), trained_model)
    trend_md = log_offline_eval(mlflow_tracking.uri(), trained_model, evaluation)
    context.add_output_metadata(offline_eval_metadata(evaluation, trend_md))
    return evaluation.to_dict(trained_model["mlflow_run_id"])


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
