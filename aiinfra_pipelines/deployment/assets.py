"""Deployment (group ``deployment``): trained model → ONNX → FP16/INT8 engines → gates → main.

``onnx_model`` exports only a candidate the offline gate let through (it depends on
``published_model``). Engine files and gate reports are written on the run's lake branch as
they are made; two blocking checks gate them (per-slice parity vs FP32, latency on the target
profile) and record audits, and ``published_engine`` merges the branch into ``main`` with the
candidate manifest only when both audits passed and still match the reports. A failed gate or
step leaves ``main`` without the candidate.
"""

import hashlib
import io
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.datasets.assets import (
    BENCHMARK_MANIFEST,
    benchmark_set,
    calibration_set,
    read_json_if_exists,
)
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.datasets.settings import calibration_gates
from aiinfra_pipelines.evaluation.assets import published_model
from aiinfra_pipelines.lake.audits import RequiredAudit, record_audit, verify_audits
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import (
    MAIN_BRANCH,
    ensure_run_branch,
    publish_with_run_branch,
    root_run_id_of,
)
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.resources import MlflowTracking

from .candidate import (
    LATEST_KEY,
    build_manifest,
    engine_key,
    identity,
    json_bytes,
    manifest_key,
    report_key,
)
from .frames import LabelledFrames, labelled_frames, require_calibration_coverage
from .parity import comparison_markdown
from .reports import BENCHMARK_GATE, PARITY_GATE, engine_benchmark_report, engine_parity_report
from .settings import deployment_gates, deployment_settings, environment_target, latency_budget

GROUP = "deployment"
PARITY_CHECK = "engine_parity_within_budget"
LATENCY_CHECK = "engine_benchmark_within_latency_budget"
OFFLINE_GATE = "offline_eval"


# -- lake helpers ----------------------------------------------------------------------------


def stage_objects(
    lake: VersionedLake, context: dg.AssetExecutionContext, objects: dict[str, bytes], message: str
) -> dict[str, dict[str, Any]]:
    """Write ``objects`` on the run branch in one commit; ``{key: {key, sha256, bytes, commit}}``.

    The commit id, not the branch, is what later steps read from: run branches are deleted
    once published, commits stay.
    """
    branch = ensure_run_branch(lake, root_run_id_of(context.run))
    for key, data in objects.items():
        lake.put_object(branch, key, data)
    commit = lake.commit(
        branch,
        message,
        {"kind": GROUP, "dagster_run_id": context.run.run_id, "asset": context.asset_key.path[-1]},
        allow_empty=True,
    )
    return {
        key: {
            "key": key,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "commit": commit,
        }
        for key, data in objects.items()
    }


def read_staged(lake: VersionedLake, entry: dict[str, Any]) -> bytes:
    """The bytes of a staged object, refused if they no longer hash as recorded."""
    data = lake.get_object(entry["commit"], entry["key"])
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{entry['key']} at {entry['commit'][:12]} does not match its SHA-256")
    return data


def _calibration_frames(lake: VersionedLake, dataset_version: str) -> pd.DataFrame:
    key = f"{DATASETS_PREFIX}calibration/{dataset_version}.parquet"
    if not lake.object_exists(MAIN_BRANCH, key):
        raise ValueError(
            f"no calibration set for {dataset_version} on main ({key}): materialize "
            "calibration_set for the model's dataset version first"
        )
    rows = pd.read_parquet(io.BytesIO(lake.get_object(MAIN_BRANCH, key)))
    return load_frames(lake, rows, MAIN_BRANCH)


def _benchmark_frames(lake: VersionedLake) -> tuple[LabelledFrames, str]:
    manifest = read_json_if_exists(lake, BENCHMARK_MANIFEST)
    if manifest is None:
        raise ValueError("no benchmark_set on main: materialize benchmark_set first")
    rows = pd.read_parquet(io.BytesIO(lake.get_object(MAIN_BRANCH, manifest["frames_key"])))
    return labelled_frames(load_frames(lake, rows, MAIN_BRANCH)), str(manifest["version"])


def _engine_bytes(
    lake: VersionedLake, onnx_model: dict, quantized_engine: dict
) -> dict[str, bytes]:
    return {
        "fp32": read_staged(lake, onnx_model["onnx"]),
        "fp16": read_staged(lake, quantized_engine["engines"]["fp16"]),
        "int8": read_staged(lake, quantized_engine["engines"]["int8"]),
    }


def _same_candidate(*outputs: dict[str, Any]) -> str:
    versions = {str(output["model_version"]) for output in outputs}
    if len(versions) != 1:
        raise ValueError(f"deployment inputs belong to different model versions {sorted(versions)}")
    return versions.pop()


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
    from .export import export_checked_onnx
    from .registry import load_network, log_onnx
    from .settings import export_tolerance

    lineage = identity(trained_model)
    settings = deployment_settings()
    calibration = labelled_frames(_calibration_frames(lake, lineage["dataset_version"]))
    network = load_network(lineage["model_uri"], mlflow_tracking.uri())
    exported = export_checked_onnx(
        network,
        calibration.spread(settings.parity_frames).inputs(),
        tolerance=export_tolerance(),
        opset=settings.opset,
    )
    version = lineage["model_version"]
    staged = stage_objects(
        lake,
        context,
        {engine_key(version, "fp32"): exported.onnx_bytes},
        f"onnx export of {lineage['registered_model']} v{version}",
    )
    entry = staged[engine_key(version, "fp32")]
    artifact = log_onnx(mlflow_tracking.uri(), lineage, exported.onnx_bytes, exported.sha256)
    context.add_output_metadata(
        {
            "model_version": version,
            "onnx_sha256": exported.sha256,
            "opset": exported.opset,
            "max_abs_error": dg.MetadataValue.json(exported.max_abs_error),
            "parity_frames": exported.parity_frames,
            "tolerance": exported.tolerance,
            "mlflow_artifact": artifact,
            "lake_key": entry["key"],
        }
    )
    return {**lineage, "onnx": {**entry, **exported.summary(), "mlflow_artifact": artifact}}


@dg.asset(group_name=GROUP, kinds={"onnx", "onnxruntime"})
def quantized_engine(
    context: dg.AssetExecutionContext, lake: VersionedLake, onnx_model: dict[str, Any]
) -> dict[str, Any]:
    """FP16 and mixed-precision INT8 QDQ engines, calibrated on the model's calibration set.

    The INT8 plan comes from the sensitivity-driven fallback loop (``deployment.fallback``);
    calibration frames missing a required condition, or a budget no fallback meets, fail here.
    """
    from .fallback import mixed_precision_int8
    from .quantize import convert_fp16

    settings = deployment_settings()
    target = environment_target(settings)
    quantization = settings.quantization.for_target(target)
    fp32 = read_staged(lake, onnx_model["onnx"])
    calibration = labelled_frames(_calibration_frames(lake, onnx_model["dataset_version"]))
    coverage = require_calibration_coverage(calibration.tags, calibration_gates()[1])
    engine = mixed_precision_int8(
        fp32, calibration, quantization, deployment_gates()["quantization"], perception_spec()
    )
    fp16 = convert_fp16(fp32, keep_io_types=quantization.fp16_keep_io_types)
    version = onnx_model["model_version"]
    staged = stage_objects(
        lake,
        context,
        {engine_key(version, "fp16"): fp16, engine_key(version, "int8"): engine.int8_onnx},
        f"fp16 and int8 engines of model v{version}",
    )
    plan = {
        **engine.plan.to_dict(),
        "quantization": {
            "calibrate_method": quantization.calibrate_method,
            "per_channel": quantization.per_channel,
            "activation_type": quantization.activation_type,
            "weight_type": quantization.weight_type,
            "extra_options": dict(quantization.extra_options),
            "target": target.name,
        },
    }
    steps = pd.DataFrame(
        [
            {
                "step": step.step,
                "fp32_nodes": ", ".join(step.fp32_nodes) or "—",
                "passed": step.passed,
                "worst": ""
                if not step.worst
                else f"{step.worst['slice']} {step.worst['metric']} "
                f"{step.worst['drop']:+.4f} (budget {step.worst['budget']})",
            }
            for step in engine.plan.steps
        ]
    )
    sensitivity = pd.DataFrame([entry.to_dict() for entry in engine.plan.sensitivity])
    context.add_output_metadata(
        {
            "model_version": version,
            "int8_sha256": engine.sha256,
            "fp16_sha256": staged[engine_key(version, "fp16")]["sha256"],
            "fp32_nodes": dg.MetadataValue.json(engine.plan.fp32_nodes),
            "fallback_steps": dg.MetadataValue.md(steps.to_markdown(index=False)),
            "sensitivity": dg.MetadataValue.md(sensitivity.to_markdown(index=False)),
            "calibration_coverage": dg.MetadataValue.json(coverage),
        }
    )
    return {
        **identity(onnx_model),
        "calibration": {"frames": len(calibration), "coverage": coverage},
        "engines": {
            "fp16": staged[engine_key(version, "fp16")],
            "int8": {**staged[engine_key(version, "int8")], "precision_plan": plan},
        },
    }


@dg.asset(group_name=GROUP, kinds={"onnxruntime"}, deps=[benchmark_set])
def engine_parity(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
) -> dict[str, Any]:
    """Per-slice metrics of the FP16 and INT8 engines vs FP32 on the benchmark set, with a
    layer-wise comparison for debugging; the report is staged for the parity check."""
    version = _same_candidate(onnx_model, quantized_engine)
    settings = deployment_settings()
    engines = _engine_bytes(lake, onnx_model, quantized_engine)
    frames, benchmark_version = _benchmark_frames(lake)
    report, comparisons = engine_parity_report(
        identity(onnx_model),
        engines.pop("fp32"),
        engines,
        frames,
        deployment_gates()["parity"],
        perception_spec(),
        layerwise_frames=settings.layerwise_frames,
        flag_sqnr_db=settings.layerwise_flag_sqnr_db,
        benchmark_version=benchmark_version,
    )
    key = report_key(version, PARITY_GATE)
    staged = stage_objects(lake, context, {key: json_bytes(report)}, f"engine parity of v{version}")
    layerwise = {
        precision: pd.DataFrame(entry["tensors"])[
            ["tensor", "op_type", "sqnr_db", "max_abs_error", "cosine"]
        ]
        .round(4)
        .to_markdown(index=False)
        for precision, entry in report["layerwise"].items()
    }
    context.add_output_metadata(
        {
            "passed": report["passed"],
            "failures": dg.MetadataValue.json(report["failures"]),
            "benchmark_version": benchmark_version,
            "frames": len(frames),
            "comparison": dg.MetadataValue.md(comparison_markdown(comparisons)),
            "first_divergence": dg.MetadataValue.json(
                {p: entry["first_divergence"] for p, entry in report["layerwise"].items()}
            ),
            **{f"layerwise_{p}": dg.MetadataValue.md(md) for p, md in layerwise.items()},
            "report": key,
        }
    )
    return {
        "model_version": version,
        "passed": report["passed"],
        "failures": report["failures"],
        "report": staged[key],
    }


@dg.asset(group_name=GROUP, kinds={"onnxruntime", "tensorrt"})
def engine_benchmark(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
) -> dict[str, Any]:
    """Latency p50/p95/p99 at batch 1, throughput at the serving batch and peak memory of every
    engine on the environment's target backend; the shipped engine is gated by its profile."""
    version = _same_candidate(onnx_model, quantized_engine)
    settings = deployment_settings()
    target = environment_target(settings)
    frames, _ = _benchmark_frames(lake)
    report = engine_benchmark_report(
        identity(onnx_model),
        _engine_bytes(lake, onnx_model, quantized_engine),
        frames.spread(settings.benchmark.frames).images,
        target,
        latency_budget(target.name),
        settings,
        perception_spec(),
    )
    key = report_key(version, BENCHMARK_GATE)
    staged = stage_objects(
        lake, context, {key: json_bytes(report)}, f"engine benchmark of v{version}"
    )
    table = pd.DataFrame(
        [
            {
                "precision": precision,
                "p50_ms": stats["p50_ms"],
                "p95_ms": stats["p95_ms"],
                "p99_ms": stats["p99_ms"],
                f"fps@{stats['serving_batch']}": round(stats["throughput_fps"], 1),
                "peak_mb": round(stats["peak_memory_mb"], 1),
            }
            for precision, stats in report["engines"].items()
        ]
    )
    context.add_output_metadata(
        {
            "passed": report["passed"],
            "failures": dg.MetadataValue.json(report["failures"]),
            "target": target.name,
            "platform": dg.MetadataValue.json(report["platform"]),
            "latency": dg.MetadataValue.md(table.to_markdown(index=False)),
            "ratios_to_fp32": dg.MetadataValue.json(report["ratios"]),
            "budget": dg.MetadataValue.json(report["budget"]),
            "report": key,
        }
    )
    return {
        "model_version": version,
        "passed": report["passed"],
        "failures": report["failures"],
        "target": target.name,
        "report": staged[key],
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
        },
    )


@dg.asset_check(asset=engine_parity, name=PARITY_CHECK, blocking=True)
def engine_parity_within_budget(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, engine_parity: dict[str, Any]
) -> dg.AssetCheckResult:
    """Every engine within the per-slice drop budget vs FP32 (gates.yaml deployment.parity)."""
    return _gate_result(context, lake, "engine_parity", PARITY_CHECK, engine_parity)


@dg.asset_check(asset=engine_benchmark, name=LATENCY_CHECK, blocking=True)
def engine_benchmark_within_latency_budget(
    context: dg.AssetCheckExecutionContext, lake: VersionedLake, engine_benchmark: dict[str, Any]
) -> dg.AssetCheckResult:
    """The shipped engine within the target profile's latency/throughput/memory budget."""
    return _gate_result(context, lake, "engine_benchmark", LATENCY_CHECK, engine_benchmark)


# -- publish -------------------------------------------------------------------------------


def _offline_report(offline_eval: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "gate": OFFLINE_GATE,
        "model_version": version,
        "passed": bool(offline_eval["passed"]),
        "failures": offline_eval.get("failures", []),
        "notes": offline_eval.get("notes", []),
        "has_production": offline_eval.get("has_production"),
        "reference_version": offline_eval.get("reference_version"),
        "benchmark_version": offline_eval.get("benchmark_version"),
        "mlflow_run_id": offline_eval.get("mlflow_run_id"),
        "candidate": offline_eval.get("candidate", []),
    }


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

    version = _same_candidate(onnx_model, quantized_engine, engine_parity, engine_benchmark)
    root = root_run_id_of(context.run)
    verify_audits(
        lake,
        root,
        [
            RequiredAudit("engine_parity", PARITY_CHECK, engine_parity["report"]["key"]),
            RequiredAudit("engine_benchmark", LATENCY_CHECK, engine_benchmark["report"]["key"]),
        ],
        None,
    )
    if offline_eval.get("mlflow_run_id") != onnx_model["mlflow_run_id"]:
        raise ValueError(
            f"the offline_eval on record is of MLflow run {offline_eval.get('mlflow_run_id')}, "
            f"not of candidate v{version} ({onnx_model['mlflow_run_id']})"
        )
    offline = _offline_report(offline_eval, version)
    offline_bytes = json_bytes(offline)
    reports = {
        OFFLINE_GATE: {
            "key": report_key(version, OFFLINE_GATE),
            "sha256": hashlib.sha256(offline_bytes).hexdigest(),
            "passed": offline["passed"],
        },
    }
    for gate, output in ((PARITY_GATE, engine_parity), (BENCHMARK_GATE, engine_benchmark)):
        stored = read_staged(lake, output["report"])
        reports[gate] = {
            "key": output["report"]["key"],
            "sha256": hashlib.sha256(stored).hexdigest(),
            "passed": bool(output["passed"]),
        }
    settings = deployment_settings()
    target = environment_target(settings)
    engines = {
        "fp32": {k: onnx_model["onnx"][k] for k in ("key", "sha256", "bytes")},
        **{
            precision: {
                k: v for k, v in entry.items() if k in ("key", "sha256", "bytes", "precision_plan")
            }
            for precision, entry in quantized_engine["engines"].items()
        },
    }
    shipped = engines[target.ship_precision]
    manifest = build_manifest(
        identity(onnx_model),
        engines,
        ship={
            "precision": target.ship_precision,
            "key": shipped["key"],
            "sha256": shipped["sha256"],
            "target": target.runtime_target,
        },
        reports=reports,
    )
    manifest_bytes = json_bytes(manifest)
    # The run branch holds the engines and gate reports the manifest names: one merge.
    commit = publish_with_run_branch(
        lake,
        root,
        {
            report_key(version, OFFLINE_GATE): offline_bytes,
            manifest_key(version): manifest_bytes,
            LATEST_KEY: json_bytes(
                {"model_version": version, "manifest_key": manifest_key(version)}
            ),
        },
        f"candidate v{version}: engines, reports and manifest",
        {"kind": "candidate", "model_version": version, "dagster_run_id": context.run.run_id},
    )
    manifest_sha = hashlib.sha256(manifest_bytes).hexdigest()
    tag_version(
        mlflow_tracking.uri(),
        onnx_model,
        {
            "onnx_sha256": engines["fp32"]["sha256"],
            "engine_sha256": shipped["sha256"],
            "engine_fp16_sha256": engines["fp16"]["sha256"],
            "candidate_manifest_sha256": manifest_sha,
            "candidate_commit": commit,
        },
    )
    return dg.MaterializeResult(
        metadata={
            "model_version": version,
            "main_commit": commit,
            "manifest": manifest_key(version),
            "manifest_sha256": manifest_sha,
            "engine_sha256": shipped["sha256"],
            "ship": dg.MetadataValue.json(manifest["ship"]),
            "lake_ref": f"lakefs://{lake.repository}/{commit}/{manifest_key(version)}",
        }
    )
