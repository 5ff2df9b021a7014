"""Deployment (group ``deployment``): trained model → ONNX → FP16/INT8 engines → gates → main.

``onnx_model`` exports only a candidate the offline gate let through (it depends on
``published_model``). Engine files and gate reports are written on the run's lake branch as
they are made; two blocking checks gate them (per-slice parity vs FP32, latency on the target
profile) and record audits, and ``published_engine`` merges the branch into ``main`` with the
candidate manifest only when both audits passed and still match the reports. A failed gate or
step leaves ``main`` without the candidate.
"""

from typing import Any

import dagster as dg

from aiinfra_pipelines.datasets.assets import benchmark_set, calibration_set
from aiinfra_pipelines.evaluation.assets import published_model
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.audits import record_audit
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import candidate_engine_key, candidate_report_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.identity import CandidateIdentity
from aiinfra_pipelines.training.resources import MlflowTracking

from .frames import labelled_frames
from .metadata import benchmark_metadata, parity_metadata, quantized_metadata
from .parity import comparison_markdown
from .publishing import (
    LATENCY_CHECK,
    OFFLINE_GATE,
    PARITY_CHECK,
    publish_candidate,
    published_metadata,
)
from .quantized import quantize_candidate
from .reports import BENCHMARK_GATE, PARITY_GATE, engine_benchmark_report, engine_parity_report
from .selection import rejections
from .settings import DeploymentSettings, LatencyBudget, deployment_gates, environment_target
from .staging import (
    GROUP,
    benchmark_frames,
    calibration_frames,
    engine_bytes,
    read_staged,
    same_candidate,
    stage_objects,
)

__all__ = ["LATENCY_CHECK", "OFFLINE_GATE", "PARITY_CHECK", "read_staged", "stage_objects"]


# -- assets --------------------------------------------------------------------------------


@dg.asset(
    group_name=GROUP,
    kinds={"onnx", "pytorch", "mlflow"},
    deps=[published_model, calibration_set],
)
def onnx_model(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    trained_model: dict[str, Any],
) -> dict[str, Any]:
    """The published candidate as ONNX (dynamic batch), checked and equal to PyTorch on real
    frames, logged to its MLflow run and hashed on its model version."""
    from aiinfra_pipelines.training.resources import load_registered_network

    from .export import export_checked_onnx
    from .model_cost import count_macs
    from .registry import log_onnx
    from .settings import export_tolerance

    candidate = CandidateIdentity.from_dict(trained_model)
    lineage = candidate.to_dict()
    settings = DeploymentSettings.load()
    calibration = labelled_frames(calibration_frames(lake, candidate.dataset_version))
    network = load_registered_network(candidate.model_uri, mlflow_tracking.uri())
    macs = count_macs(network)
    exported = export_checked_onnx(
        network,
        calibration.spread(settings.parity_frames).inputs(),
        tolerance=export_tolerance(),
        opset=settings.opset,
    )
    version = candidate.model_version
    staged = stage_objects(
        lake,
        context,
        {candidate_engine_key(version, "fp32"): exported.onnx_bytes},
        f"onnx export of {candidate.registered_model} v{version}",
    )
    entry = staged[candidate_engine_key(version, "fp32")]
    artifact = log_onnx(mlflow_tracking.uri(), lineage, exported.onnx_bytes, exported.sha256)
    context.add_output_metadata(
        {
            "model_version": version,
            "onnx_sha256": exported.sha256,
            "opset": exported.opset,
            "max_abs_error": dg.MetadataValue.json(exported.max_abs_error),
            "parity_frames": exported.parity_frames,
            "tolerance": exported.tolerance,
            "macs_per_frame": macs,
            "mlflow_artifact": artifact,
            "lake_key": entry.key,
        }
    )
    return {
        **lineage,
        "onnx": {
            **entry.to_dict(),
            **exported.summary(),
            "macs_per_frame": macs,
            "mlflow_artifact": artifact,
        },
    }


@dg.asset(group_name=GROUP, kinds={"onnx", "onnxruntime"})
def quantized_engine(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    onnx_model: dict[str, Any],
) -> dict[str, Any]:
    """FP16 and mixed-precision INT8 QDQ engines, calibrated on the model's calibration set.

    The INT8 plan comes from the sensitivity-driven fallback loop (``deployment.fallback``);
    when no plan holds every slice, quantization-aware fine-tuning (``deployment.qat``) makes
    the INT8 engine instead, gated by the same budgets. Calibration frames missing a required
    condition, or a budget neither meets, fail here.
    """
    candidate = quantize_candidate(lake, context, onnx_model, mlflow_tracking.uri())
    context.add_output_metadata(quantized_metadata(candidate))
    return candidate.to_dict()


@dg.asset(group_name=GROUP, kinds={"onnxruntime"}, deps=[benchmark_set])
def engine_parity(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
) -> dict[str, Any]:
    """Per-slice metrics of the FP16 and INT8 engines vs FP32 on the benchmark set, with a
    layer-wise comparison for debugging, and the engine to ship: the smallest the target may
    run that holds every slice budget. The report is staged for the parity check."""
    version = same_candidate(onnx_model, quantized_engine)
    settings = DeploymentSettings.load()
    target = environment_target(settings)
    engines = engine_bytes(lake, onnx_model, quantized_engine)
    frames, benchmark_version = benchmark_frames(lake)
    report, comparisons = engine_parity_report(
        CandidateIdentity.from_dict(onnx_model).to_dict(),
        engines.pop("fp32"),
        engines,
        frames,
        deployment_gates()["parity"],
        perception_spec(),
        layerwise_frames=settings.layerwise_frames,
        flag_sqnr_db=settings.layerwise_flag_sqnr_db,
        benchmark_version=benchmark_version,
        ship_precisions=target.ship_precisions,
    )
    if report["ship_precision"] not in (None, target.ship_precisions[0]):
        context.log.warning(
            f"v{version} ships {report['ship_precision']}, not {target.ship_precisions[0]}: "
            f"{'; '.join(rejections(report['selection']))}"
        )
    report = {**report, **gate_rules().to_dict()}
    key = candidate_report_key(version, PARITY_GATE)
    staged = stage_objects(
        lake, context, {key: json_document(report)}, f"engine parity of v{version}"
    )
    context.add_output_metadata(
        parity_metadata(
            report, comparison_markdown(comparisons), benchmark_version, len(frames), key
        )
    )
    return {
        "model_version": version,
        "passed": report["passed"],
        "failures": report["failures"],
        "ship_precision": report["ship_precision"],
        "selection": report["selection"],
        "report": staged[key].to_dict(),
    }


@dg.asset(group_name=GROUP, kinds={"onnxruntime", "tensorrt"})
def engine_benchmark(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
    engine_parity: dict[str, Any],
) -> dict[str, Any]:
    """Latency p50/p95/p99 at batch 1, throughput at the serving batch and peak memory of every
    engine on the environment's target backend; the engine engine_parity chose to ship is gated
    by the target's profile."""
    version = same_candidate(onnx_model, quantized_engine, engine_parity)
    settings = DeploymentSettings.load()
    target = environment_target(settings)
    frames, _ = benchmark_frames(lake)
    report = engine_benchmark_report(
        CandidateIdentity.from_dict(onnx_model).to_dict(),
        engine_bytes(lake, onnx_model, quantized_engine),
        frames.spread(settings.benchmark.frames).images,
        target,
        LatencyBudget.load(target.name),
        settings,
        perception_spec(),
        ship_precision=str(engine_parity["ship_precision"]),
        macs_per_frame=onnx_model["onnx"].get("macs_per_frame"),
    )
    report = {**report, **gate_rules().to_dict()}
    key = candidate_report_key(version, BENCHMARK_GATE)
    staged = stage_objects(
        lake, context, {key: json_document(report)}, f"engine benchmark of v{version}"
    )
    context.add_output_metadata(benchmark_metadata(report, target.name, key))
    return {
        "model_version": version,
        "passed": report["passed"],
        "failures": report["failures"],
        "target": target.name,
        "ship_precision": report["ship_precision"],
        "report": staged[key].to_dict(),
    }


# -- gates ---------------------------------------------------------------------------------


def _gate_result(
    context: dg.AssetCheckExecutionContext,
    lake: VersionedLake,
    asset: str,
    check: str,
    output: dict[str, Any],
) -> dg.AssetCheckResult:
    passed = bool(output["passed"])
    record_audit(
        lake,
        root_run_id_of(context.run),
        asset=asset,
        check=check,
        partition=None,
        audited_key=output["report"]["key"],
        passed=passed,
        dagster_run_id=context.run.run_id,
    )
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "failures": dg.MetadataValue.json(output["failures"]),
            "report": output["report"]["key"],
            "model_version": str(output["model_version"]),
            "ship_precision": str(output.get("ship_precision")),
        },
    )


@dg.asset_check(asset=engine_parity, name=PARITY_CHECK, blocking=True)
def engine_parity_within_budget(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, engine_parity: dict[str, Any]
) -> dg.AssetCheckResult:
    """An engine the target may run holds every per-slice drop budget vs FP32 (gates.yaml
    deployment.parity); the smallest such one is what ships."""
    return _gate_result(context, lake, "engine_parity", PARITY_CHECK, engine_parity)


@dg.asset_check(asset=engine_benchmark, name=LATENCY_CHECK, blocking=True)
def engine_benchmark_within_latency_budget(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, engine_benchmark: dict[str, Any]
) -> dg.AssetCheckResult:
    """The engine chosen to ship within the target profile's latency/throughput/memory budget."""
    return _gate_result(context, lake, "engine_benchmark", LATENCY_CHECK, engine_benchmark)


# -- publish -------------------------------------------------------------------------------


@dg.asset(group_name=GROUP, kinds={"lakefs", "mlflow"})
def published_engine(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    offline_eval: dict[str, Any],
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
    engine_parity: dict[str, Any],
    engine_benchmark: dict[str, Any],
) -> dg.MaterializeResult:
    """Write–audit–publish: engines, reports and the candidate manifest onto ``main`` in one
    merge, only behind passing parity and latency audits; then the hashes onto the version."""
    from .registry import tag_version

    same_candidate(onnx_model, quantized_engine, engine_parity, engine_benchmark)
    published = publish_candidate(
        lake,
        root_run_id_of(context.run),
        context.run.run_id,
        offline_eval,
        onnx_model,
        quantized_engine,
        engine_parity,
        engine_benchmark,
    )
    tag_version(mlflow_tracking.uri(), onnx_model, published.registry_tags())
    return dg.MaterializeResult(metadata=published_metadata(published, lake.repository))
