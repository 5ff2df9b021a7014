"""The compression report on real engines: per-slice scores, timings, size, the budget verdict
of every variant and the choice of the smallest one that holds every slice."""

from __future__ import annotations

from functools import partial

import pytest

from aiinfra_pipelines.deployment.backends import create_engine
from aiinfra_pipelines.deployment.benchmark import measure_engine
from aiinfra_pipelines.deployment.compression import (
    FP16,
    PRUNED,
    PTQ,
    QAT,
    STUDENT,
    TEACHER,
    CompressionVariant,
    compression_report,
    smallest_within_budget,
    variants_table,
)
from aiinfra_pipelines.deployment.memory_probe import probe_peak_memory_mb
from aiinfra_pipelines.deployment.quantize import convert_fp16, quantize_int8
from aiinfra_pipelines.perception.contract import perception_spec

from .conftest import QUANTIZATION_BUDGETS

# Parity budgets wide enough for plain INT8 of a 4-epoch test network on a few held-out logs,
# far too narrow for the outlier engine whose INT8 rounds a whole feature map to zero.
BUDGETS = {
    **QUANTIZATION_BUDGETS,
    "budgets": {"occupancy_accuracy": 0.05, "occupancy_agreement": 0.1, "lead_gap_diff_m": 5.0},
}


@pytest.fixture(scope="module")
def report(exported, outlier_onnx, calibration, held_out, settings):
    spec = perception_spec()
    fp32 = exported.onnx_bytes
    inputs = calibration.inputs()
    variants = [
        CompressionVariant(TEACHER, None, "no teacher trained this cycle"),
        CompressionVariant(STUDENT, fp32),
        # The outlier network is the same function in FP32 (the test model with one channel
        # scaled x1000 and compensated); naively quantized it loses that channel's neighbours:
        # a small engine that breaks the budget, which the choice must pass over.
        CompressionVariant(PTQ, quantize_int8(outlier_onnx, inputs, settings.quantization)),
        CompressionVariant(QAT, quantize_int8(fp32, inputs, settings.quantization)),
        CompressionVariant(FP16, convert_fp16(fp32)),
    ]

    def predict(onnx_bytes, precision):
        return create_engine(onnx_bytes, spec, precision=precision).infer(held_out.images)

    def measure(onnx_bytes, precision):
        return measure_engine(
            lambda: create_engine(onnx_bytes, spec, precision=precision),
            held_out.images[:16],
            precision=precision,
            iterations=20,
            warmup=2,
            serving_batch=32,
            throughput_iterations=3,
            memory_probe=partial(
                probe_peak_memory_mb,
                onnx_bytes,
                held_out.images[:16],
                backend="onnxruntime",
                precision=precision,
                serving_batch=32,
                intra_op_threads=1,
            ),
        )

    return compression_report(variants, held_out, BUDGETS, spec, predict=predict, measure=measure)


def test_every_variant_is_scored_timed_and_sized(report, held_out):
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == [TEACHER, STUDENT, PTQ, QAT, FP16]  # the report's order
    assert rows[TEACHER] == {
        "variant": TEACHER,
        "available": False,
        "note": "no teacher trained this cycle",
    }
    for name in (STUDENT, PTQ, QAT, FP16):
        row = rows[name]
        assert 0 < row["p50_ms_batch1"] <= row["p99_ms_batch1"]
        assert row["throughput_fps"] > 0 and row["serving_batch"] == 32
        assert row["bytes"] > 0 and row["peak_memory_mb"] > 0
        assert 0 <= row["worst_slice_accuracy"] <= row["occupancy_accuracy"] <= 1
    # INT8 weights take a quarter of FP32's bytes, FP16 half (graph overhead aside).
    assert rows[QAT]["bytes"] < 0.5 * rows[STUDENT]["bytes"]
    assert rows[FP16]["bytes"] < 0.75 * rows[STUDENT]["bytes"]
    per_slice = [r for r in report["per_slice"] if r["variant"] == STUDENT]
    assert {r["slice"] for r in per_slice if r["kind"] == "slice"} == set(held_out.tags["slice"])
    assert report["benchmark_frames"] == len(held_out)


def test_the_choice_is_the_smallest_variant_that_holds_every_slice(report):
    rows = {row["variant"]: row for row in report["variants"]}
    assert rows[STUDENT]["within_budget"]  # the reference holds against itself
    assert not rows[PTQ]["within_budget"] and rows[PTQ]["failures"]
    assert rows[QAT]["within_budget"] and rows[FP16]["within_budget"], rows
    # The breaching engine is as small as the holding INT8 one: the choice passes over it.
    assert report["choice"] == QAT
    table = variants_table(report)
    assert list(table["variant"]) == [TEACHER, STUDENT, PTQ, QAT, FP16]


def test_the_teacher_is_never_the_choice_and_nothing_holding_means_no_choice():
    teacher = {"variant": TEACHER, "available": True, "within_budget": True, "bytes": 1}
    student = {
        "variant": STUDENT,
        "available": True,
        "within_budget": True,
        "bytes": 100,
        "p99_ms_batch1": 1.0,
    }
    pruned = {**student, "variant": PRUNED, "bytes": 50, "within_budget": False}
    assert smallest_within_budget([teacher, student, pruned]) == STUDENT
    assert smallest_within_budget([teacher, pruned]) is None


def test_a_report_without_the_car_network_is_refused(held_out):
    with pytest.raises(ValueError, match="student_fp32"):
        compression_report(
            [CompressionVariant(FP16, b"")],
            held_out,
            QUANTIZATION_BUDGETS,
            perception_spec(),
            predict=lambda *_: None,
            measure=lambda *_: None,
        )
