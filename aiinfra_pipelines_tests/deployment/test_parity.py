"""Per-slice engine parity vs FP32 and the layer-wise comparison."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.deployment.layerwise import (
    activation_tensors,
    first_divergence,
    layerwise_comparison,
)
from aiinfra_pipelines.deployment.parity import compare_with_fp32, slice_masks, slice_metrics
from aiinfra_pipelines.deployment.quantize import convert_fp16, quantize_int8
from aiinfra_pipelines.deployment.reports import engine_parity_report
from aiinfra_pipelines.evaluation.slices import evaluate_by_slice
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

PARITY = {
    "min_slice_frames": 20,
    "budgets": {"occupancy_accuracy": 0.02, "occupancy_agreement": 0.05, "lead_gap_diff_m": 1.5},
    "slice_overrides": {"night/*/*": {"occupancy_accuracy": 0.025}},
}


def _predict(onnx_bytes, frames):
    return OnnxRuntimeEngine(onnx_bytes, perception_spec()).infer(frames.images)


def test_slice_rows_are_named_as_the_offline_evaluation_names_them(held_out, exported):
    spec = perception_spec()
    predictions = _predict(exported.onnx_bytes, held_out)
    table = slice_metrics(held_out, predictions, predictions, spec)
    offline = evaluate_by_slice(
        held_out.tags,
        predictions.occupancy,
        held_out.occupancy_target,
        predictions.lead_gap_m / spec.max_range_m,
        held_out.lead_gap_target,
        spec.max_range_m,
    )
    assert list(table["slice"]) == list(offline["slice"]) == list(slice_masks(held_out.tags))
    assert (table["occupancy_agreement"] == 1.0).all() and (table["lead_gap_diff_m"] == 0.0).all()


def test_the_fp32_engine_against_itself_passes_with_zero_drops(held_out, exported):
    spec = perception_spec()
    predictions = _predict(exported.onnx_bytes, held_out)
    table = slice_metrics(held_out, predictions, predictions, spec)
    comparison = compare_with_fp32("fp32", table, table, PARITY)
    assert comparison.passed and comparison.table["gated"].any()
    assert (comparison.table["drop"].abs() < 1e-12).all()


def test_a_budget_breach_names_the_engine_slice_metric_and_budget(
    held_out, outlier_onnx, calibration, settings
):
    spec = perception_spec()
    reference = _predict(outlier_onnx, held_out)
    int8 = quantize_int8(outlier_onnx, calibration.inputs(), settings.quantization)
    comparison = compare_with_fp32(
        "int8",
        slice_metrics(held_out, _predict(int8, held_out), reference, spec),
        slice_metrics(held_out, reference, reference, spec),
        PARITY,
    )
    assert not comparison.passed
    failure = comparison.failures[0]
    assert failure.startswith("int8 ") and "> budget" in failure and "frames)" in failure
    worst = comparison.worst()
    assert worst["drop"] > worst["budget"]
    night = comparison.table[
        (comparison.table["slice"] == "night/*/*")
        & (comparison.table["metric"] == "occupancy_accuracy")
    ]
    # The held-out drives of fleet_frames(4, 2, 0) hold 71 night frames: gated, by the override.
    assert len(night) == 1 and bool(night["gated"].iloc[0]), comparison.table
    assert night["budget"].iloc[0] == pytest.approx(0.025)  # the slice override applies


def test_unknown_budget_metrics_are_a_configuration_error(held_out, exported):
    spec = perception_spec()
    predictions = _predict(exported.onnx_bytes, held_out)
    table = slice_metrics(held_out, predictions, predictions, spec)
    with pytest.raises(ValueError, match="occupancy_acuracy"):
        compare_with_fp32("fp32", table, table, {"budgets": {"occupancy_acuracy": 0.1}})


def test_layerwise_comparison_follows_the_fp32_graph_and_finds_where_int8_diverges(
    outlier_onnx, calibration, settings
):
    import onnx

    sample = calibration.inputs()[:16]
    fp16 = layerwise_comparison(outlier_onnx, convert_fp16(outlier_onnx), sample)
    expected = [t.tensor for t in activation_tensors(onnx.load_from_string(outlier_onnx))]
    assert list(fp16["tensor"]) == expected  # every activation, in graph order
    assert (fp16["cosine"] > 0.999).all()
    assert first_divergence(fp16, flag_sqnr_db=20.0) is None

    int8 = quantize_int8(outlier_onnx, calibration.inputs(), settings.quantization)
    table = layerwise_comparison(outlier_onnx, int8, sample)
    divergence = first_divergence(table, flag_sqnr_db=20.0)
    assert divergence is not None
    # The outlier tensor is block 1's activation: divergence starts there or right after.
    position = expected.index(divergence["tensor"])
    assert position <= expected.index("/features/features.2/features.2.2/Relu_output_0")


def test_the_parity_report_carries_verdict_tables_and_layerwise_view(
    held_out, exported, calibration, settings
):
    int8 = quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization)
    report, comparisons = engine_parity_report(
        {"model_version": "7"},
        exported.onnx_bytes,
        {"fp16": convert_fp16(exported.onnx_bytes), "int8": int8},
        held_out,
        PARITY,
        perception_spec(),
        layerwise_frames=8,
        flag_sqnr_db=20.0,
        benchmark_version="benchmark-v0001",
    )
    assert report["model_version"] == "7" and report["gate"] == "engine_parity"
    # The healthy model's INT8 holds every slice, and it is the smallest engine: it ships.
    assert all(c.passed for c in comparisons) and report["passed"] and not report["failures"]
    assert report["ship_precision"] == "int8" and report["selection"]["choice"] == "int8"
    assert set(report["engines"]) == set(report["layerwise"]) == {"fp16", "int8"}
    assert report["layerwise"]["int8"]["frames"] == 8 and report["layerwise"]["int8"]["tensors"]
    assert report["frames"] == len(held_out)


def test_the_smallest_engine_that_holds_every_slice_ships_and_none_holding_refuses(
    held_out, outlier_onnx, calibration, settings
):
    # The outlier model's plain INT8 breaks a slice (the breach test above); its FP16 does not.
    int8 = quantize_int8(outlier_onnx, calibration.inputs(), settings.quantization)
    fp16 = convert_fp16(outlier_onnx)
    assert len(int8) < len(fp16) < len(outlier_onnx)

    def parity(engines, ship_precisions):
        report, _ = engine_parity_report(
            {"model_version": "7"},
            outlier_onnx,
            engines,
            held_out,
            PARITY,
            perception_spec(),
            layerwise_frames=4,
            flag_sqnr_db=20.0,
            ship_precisions=ship_precisions,
        )
        return report

    report = parity({"fp16": fp16, "int8": int8}, ("int8", "fp16", "fp32"))
    assert not report["engines"]["int8"]["passed"] and report["engines"]["fp16"]["passed"]
    assert report["passed"] and report["failures"] == [] and report["ship_precision"] == "fp16"
    options = {option["engine"]: option for option in report["selection"]["options"]}
    assert options["int8"]["holds"] is False
    assert options["int8"]["failures"] == report["engines"]["int8"]["failures"]
    assert options["fp16"] == {"engine": "fp16", "bytes": len(fp16), "holds": True, "failures": []}
    assert options["fp32"]["holds"] is True and options["fp32"]["bytes"] == len(outlier_onnx)

    # A target that runs INT8 only: nothing it may ship holds, so the gate refuses with the
    # breaches of the engine it would have run.
    only_int8 = parity({"fp16": fp16, "int8": int8}, ("int8",))
    assert not only_int8["passed"] and only_int8["ship_precision"] is None
    assert only_int8["failures"] == report["engines"]["int8"]["failures"]

    # No INT8 engine at all (quantized_engine could not make one): FP16 ships, and the record
    # names the missing engine; were FP16 not allowed either, the refusal says INT8 was not built.
    without_int8 = parity({"fp16": fp16}, ("int8", "fp16"))
    assert without_int8["ship_precision"] == "fp16"
    assert without_int8["selection"]["missing"] == ["int8"]
    refused = parity({"fp16": fp16}, ("int8",))
    assert not refused["passed"] and refused["failures"] == [
        "int8: no engine was built (quantized_engine could not make one)"
    ]
