"""INT8/FP16 quantization: determinism, sensitivity ranking, the fallback loop, bad calibration."""

from __future__ import annotations

import hashlib
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from aiinfra_pipelines.datasets.settings import CalibrationGates
from aiinfra_pipelines.deployment.fallback import QuantizationBudgetError, mixed_precision_int8
from aiinfra_pipelines.deployment.frames import (
    CalibrationCoverageError,
    require_calibration_coverage,
)
from aiinfra_pipelines.deployment.layerwise import run_tensors, sqnr_db
from aiinfra_pipelines.deployment.quantize import (
    QuantizationWorkspace,
    convert_fp16,
    quantizable_nodes,
    quantize_int8,
)
from aiinfra_pipelines.deployment.sensitivity import rank_sensitivity
from aiinfra_pipelines.perception.contract import perception_spec

from .conftest import OUTLIER_CONSUMER, OUTLIER_PRODUCER, QUANTIZATION_BUDGETS


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def outlier_plan(outlier_onnx, calibration, settings):
    return mixed_precision_int8(
        outlier_onnx, calibration, settings.quantization, QUANTIZATION_BUDGETS, perception_spec()
    )


def test_same_model_and_calibration_frames_give_the_same_int8_bytes(
    exported, calibration, settings
):
    first = quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization)
    second = quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization)
    assert _sha(first) == _sha(second)
    ops = {node.op_type for node in onnx.load_from_string(first).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    # Other calibration frames fix other ranges: the hash identifies the calibration too.
    other = quantize_int8(exported.onnx_bytes, calibration.inputs()[::2], settings.quantization)
    assert _sha(other) != _sha(first)


def test_the_fallback_plan_and_its_engine_are_reproducible(
    outlier_plan, outlier_onnx, calibration, settings
):
    again = mixed_precision_int8(
        outlier_onnx, calibration, settings.quantization, QUANTIZATION_BUDGETS, perception_spec()
    )
    assert again.sha256 == outlier_plan.sha256
    assert again.plan.to_dict() == outlier_plan.plan.to_dict()


def test_sensitivity_ranks_the_outlier_channel_nodes_first(outlier_onnx, calibration, settings):
    nodes = quantizable_nodes(outlier_onnx, settings.quantization.candidate_op_types)
    with QuantizationWorkspace(outlier_onnx, calibration.inputs(), settings.quantization) as ws:
        ranking = rank_sensitivity(ws, nodes, calibration.inputs(), "output_sqnr_db")
        by_layer = rank_sensitivity(ws, nodes, calibration.inputs(), "layer_sqnr_db")
    assert [entry.rank for entry in ranking] == list(range(1, len(nodes) + 1))
    assert sorted(entry.node for entry in ranking) == sorted(node.name for node in nodes)
    assert ranking[0].node in {OUTLIER_PRODUCER, OUTLIER_CONSUMER}
    assert by_layer[0].node in {OUTLIER_PRODUCER, OUTLIER_CONSUMER}
    # Far worse than any ordinary layer, not a coin flip between near-equal scores.
    ordinary = [e.score for e in ranking if e.node not in {OUTLIER_PRODUCER, OUTLIER_CONSUMER}]
    assert ranking[0].score < min(ordinary) - 10.0


def test_the_fallback_loop_keeps_sensitive_nodes_in_fp32_until_every_slice_is_in_budget(
    outlier_plan, outlier_onnx, calibration
):
    plan = outlier_plan.plan
    first, last = plan.steps[0], plan.steps[-1]
    assert not first.passed and first.failures  # all-INT8 breaks the budget...
    assert last.passed and not last.failures  # ...the chosen mix holds it
    assert plan.fp32_nodes == last.fp32_nodes
    assert plan.fp32_nodes[0] == plan.sensitivity[0].node  # most sensitive falls back first
    assert [len(step.fp32_nodes) for step in plan.steps] == list(range(len(plan.steps)))
    assert 0 < len(plan.fp32_nodes) <= QUANTIZATION_BUDGETS["max_fp32_nodes"]
    assert plan.int8_nodes and not set(plan.int8_nodes) & set(plan.fp32_nodes)
    # The recorded drops are per gated slice, and the final ones are within budget.
    for slice_drops in last.drops.values():
        for metric, drop in slice_drops.items():
            assert drop <= QUANTIZATION_BUDGETS["budgets"][metric] + 1e-9
    # And the shipped bytes really keep those nodes unquantized: an FP32 node computes with
    # its float weights, an INT8 node with dequantized INT8 weights. (An FP32 node's *input*
    # may still be a dequantized tensor when an INT8 node shares it: the two heads both read
    # the trunk's output.)
    model = onnx.load_from_string(outlier_plan.int8_onnx)
    float_weights = {init.name for init in model.graph.initializer}
    weights = {node.name: node.input[1] for node in model.graph.node if len(node.input) > 1}
    assert all(weights[name] in float_weights for name in plan.fp32_nodes)
    assert all(weights[name].endswith("DequantizeLinear_Output") for name in plan.int8_nodes)
    reference = run_tensors(outlier_onnx, ["lead_gap"], calibration.inputs())["lead_gap"]
    shipped = run_tensors(outlier_plan.int8_onnx, ["lead_gap"], calibration.inputs())["lead_gap"]
    assert sqnr_db(reference, shipped) > 20.0


def test_a_breach_no_allowed_fallback_fixes_fails_naming_the_slices(
    outlier_onnx, calibration, settings
):
    no_fallback = {**QUANTIZATION_BUDGETS, "max_fp32_nodes": 0}
    with pytest.raises(QuantizationBudgetError, match="no fallback can fix") as failure:
        mixed_precision_int8(
            outlier_onnx, calibration, settings.quantization, no_fallback, perception_spec()
        )
    message = str(failure.value)
    assert "max_fp32_nodes = 0" in message and "budget" in message
    assert any(name in message for name in calibration.tags["slice"].unique())
    assert len(failure.value.plan.steps) == 1 and not failure.value.plan.passed


def test_calibration_frames_missing_a_required_condition_are_refused(calibration):
    min_share = CalibrationGates.load().min_share
    report = require_calibration_coverage(calibration.tags, min_share)
    assert report["meets_min_share"]
    without_fog = calibration.tags[calibration.tags["weather"] != "fog"]
    with pytest.raises(CalibrationCoverageError, match="weather=fog") as failure:
        require_calibration_coverage(without_fog, min_share)
    assert any(c.startswith("weather=fog") for c in failure.value.conditions)


def test_fp16_engine_is_half_precision_inside_with_float32_io(exported, calibration):
    fp16 = convert_fp16(exported.onnx_bytes)
    model = onnx.load_from_string(fp16)
    halves = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert halves and all(
        i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in model.graph.input
    )
    reference = run_tensors(exported.onnx_bytes, ["occupancy_logits"], calibration.inputs()[:32])
    half = run_tensors(fp16, ["occupancy_logits"], calibration.inputs()[:32])
    assert sqnr_db(reference["occupancy_logits"], half["occupancy_logits"]) > 40.0


def _cpu_kernels(onnx_bytes: bytes) -> Counter:
    """Operator types of the graph onnxruntime's CPU provider really runs (after its own
    optimizer fused what it could): what the INT8 engine costs, read without timing it."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="aiinfra-test-kernels-") as directory:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        ort.InferenceSession(onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"])
        return Counter(
            node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node
        )


def test_the_cpu_target_runs_every_conv_and_gemm_as_an_integer_kernel(
    exported, calibration, settings
):
    cpu = settings.quantization.for_target(settings.targets["cpu-ci"])
    assert (cpu.activation_type, cpu.weight_type, cpu.preprocess) == ("QUInt8", "QInt8", True)
    weighted = quantizable_nodes(exported.onnx_bytes, ("Conv", "Gemm"))
    float_kernels = {"Conv", "FusedConv", "Gemm", "FusedGemm"}

    shipped = _cpu_kernels(quantize_int8(exported.onnx_bytes, calibration.inputs(), cpu))
    assert shipped["QLinearConv"] + shipped["QGemm"] == len(weighted)
    assert not float_kernels & set(shipped)

    # The recipe before it (signed activations, graph as exported) leaves Conv/Gemm in float
    # between Q/DQ pairs: INT8 then only adds quantize/dequantize work.
    before = replace(cpu, activation_type="QInt8", preprocess=False)
    unfused = _cpu_kernels(quantize_int8(exported.onnx_bytes, calibration.inputs(), before))
    assert sum(unfused[op] for op in float_kernels) > 0


def test_a_preprocessed_graph_quantizes_reproducibly_and_falls_back_by_the_same_names(
    outlier_onnx, calibration, settings
):
    cpu = settings.quantization.for_target(settings.targets["cpu-ci"])
    first = quantize_int8(outlier_onnx, calibration.inputs(), cpu)
    assert _sha(first) == _sha(quantize_int8(outlier_onnx, calibration.inputs(), cpu))
    # Node names come from the exported graph; pre-processing must not rename them, or a
    # fallback plan would keep nothing in FP32.
    kept = quantize_int8(outlier_onnx, calibration.inputs(), cpu, exclude=[OUTLIER_PRODUCER])
    model = onnx.load_from_string(kept)
    node = next(node for node in model.graph.node if node.name == OUTLIER_PRODUCER)
    assert node.input[1] in {init.name for init in model.graph.initializer}  # float weights
    plan = mixed_precision_int8(
        outlier_onnx, calibration, cpu, QUANTIZATION_BUDGETS, perception_spec()
    )
    assert plan.plan.passed and set(plan.plan.fp32_nodes) <= {n.name for n in model.graph.node}
