"""The compression report asset (group ``compression``): cloud model vs car model, measured.

Outside the training cycle on purpose: pruning fine-tunes the network several times and QAT
once more, minutes of compute that the loop does not need to certify a candidate (the cycle
ships PTQ INT8, or QAT when PTQ cannot hold a slice). Operators and CI materialize it for the
newest candidate when choosing how the car model is compressed.
"""

from typing import Any

import dagster as dg

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.metadata_tables import markdown_table
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.identity import CandidateIdentity
from aiinfra_pipelines.training.resources import MlflowTracking

from .compression import compression_report, target_measure, variants_table
from .frames import labelled_frames
from .staging import (
    benchmark_frames,
    calibration_frames,
    dataset_split_frames,
    read_staged,
    same_candidate,
)

COMPRESSION_GROUP = "compression"
COMPRESSION_REPORT = "compression"
MLFLOW_ARTIFACT_PATH = "compression"


def compression_report_key(model_version: str) -> str:
    """Beside, not inside, the candidate's folder: the candidate manifest lists every file
    under ``candidates/<version>/`` and this report is made after the candidate published."""
    return f"compression/{model_version}/report.json"


@dg.asset(
    name="compression_report",
    group_name=COMPRESSION_GROUP,
    kinds={"pytorch", "onnxruntime", "mlflow"},
)
def compression_report_asset(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    mlflow_tracking: MlflowTracking,
    teacher_model: dict[str, Any],
    onnx_model: dict[str, Any],
    quantized_engine: dict[str, Any],
) -> dict[str, Any]:
    """Teacher FP32, student FP32, pruned, PTQ INT8, QAT INT8 and FP16 of the candidate, per
    slice on the benchmark and timed on the environment's target; the smallest one that
    holds every slice budget is the report's choice."""
    from aiinfra_pipelines.training.resources import load_registered_network
    from aiinfra_pipelines.training.training_run import environment_training_overrides

    from .compressed_models import CandidateGraphs, compressed_variants
    from .reports import check_target_hardware
    from .settings import DeploymentSettings, deployment_gates, environment_target

    version = same_candidate(onnx_model, quantized_engine)
    candidate = CandidateIdentity.from_dict(onnx_model)
    settings = DeploymentSettings.load()
    target = environment_target(settings)
    spec = perception_spec()
    uri = mlflow_tracking.uri()
    student = load_registered_network(candidate.model_uri, uri)
    teacher = None
    if teacher_model.get("trained"):
        teacher = load_registered_network(teacher_model["model_uri"], uri)
    engines = quantized_engine["engines"]
    int8 = engines.get("int8")  # absent when neither PTQ nor QAT held every slice
    graphs = CandidateGraphs(
        fp32=read_staged(lake, onnx_model["onnx"]),
        fp16=read_staged(lake, engines["fp16"]),
        int8=None if int8 is None else read_staged(lake, int8),
        int8_path="none" if int8 is None else str(int8["precision_plan"].get("path", "ptq")),
    )
    train, val = dataset_split_frames(lake, onnx_model, ("train", "val"))
    calibration = labelled_frames(calibration_frames(lake, candidate.dataset_version))
    variants = compressed_variants(
        student,
        teacher,
        graphs,
        calibration,
        train,
        val,
        spec,
        training_config=environment_training_overrides(),
        log=context.log.info,
    )
    benchmark, benchmark_version = benchmark_frames(lake)
    images = benchmark.spread(settings.benchmark.frames).images
    platform = check_target_hardware(target)
    report = compression_report(
        variants,
        benchmark,
        deployment_gates()["parity"],
        spec,
        predict=lambda onnx_bytes, precision: _predict(onnx_bytes, precision, benchmark, spec),
        measure=target_measure(target, platform, images, settings, spec),
    )
    report = {
        **candidate.to_dict(),
        "report": COMPRESSION_REPORT,
        "target": target.name,
        "benchmark_version": benchmark_version,
        "teacher": {k: teacher_model.get(k) for k in ("trained", "model_uri", "model_version")},
        **report,
    }
    key = compression_report_key(str(version))
    publish_objects(
        lake,
        root_run_id_of(context.run),
        {key: json_document(report)},
        f"compression report of model v{version}",
        {"model_version": str(version)},
    )
    table = variants_table(report)
    _log_to_mlflow(uri, candidate.mlflow_run_id, report, markdown_table(table))
    context.add_output_metadata(
        {
            "model_version": str(version),
            "choice": str(report["choice"]),
            "variants": dg.MetadataValue.md(markdown_table(table)),
            "lake_key": key,
        }
    )
    return {"model_version": str(version), "choice": report["choice"], "key": key}


def _predict(onnx_bytes: bytes, precision: str, frames: Any, spec: Any) -> Any:
    from .backends import create_engine

    return create_engine(onnx_bytes, spec, precision=precision).infer(frames.images)


def _log_to_mlflow(tracking_uri: str, run_id: str, report: dict, table_md: str) -> None:
    """The report (JSON) and its table (markdown) as artifacts of the candidate's MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    client.log_dict(run_id, report, f"{MLFLOW_ARTIFACT_PATH}/report.json")
    client.log_text(run_id, table_md, f"{MLFLOW_ARTIFACT_PATH}/report.md")


__all__ = ["COMPRESSION_GROUP", "compression_report_asset", "compression_report_key"]
