"""INT8 engines that take the camera's bytes (deployment.camera_input), on the session's
trained network and real fleet frames: same outputs, fewer operations, every consumer fed."""

from __future__ import annotations

import copy
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.deployment.camera_input import (
    CameraInputError,
    require_same_outputs,
    rewrite_for_camera_input,
    takes_camera_bytes,
    with_camera_input,
)
from aiinfra_pipelines.deployment.layerwise import layerwise_comparison
from aiinfra_pipelines.deployment.quantize import quantize_int8
from aiinfra_pipelines.deployment.settings import DeploymentSettings
from aiinfra_pipelines.mining.engine_runner import run_engine_over_frames
from aiinfra_pipelines.perception.contract import INPUT_NAME, perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine


@pytest.fixture(scope="module")
def cpu_quantization(settings):
    return settings.quantization.for_target(settings.targets["cpu-ci"])


@pytest.fixture(scope="module")
def float_int8(exported, calibration, cpu_quantization) -> bytes:
    """The cpu-ci INT8 graph as the quantizer writes it (float input, pinned quantization)."""
    return quantize_int8(exported.onnx_bytes, calibration.inputs(), cpu_quantization)


@pytest.fixture(scope="module")
def camera_int8(float_int8, calibration):
    return with_camera_input(float_int8, calibration.images[:32])


def _optimized_ops(onnx_bytes: bytes) -> Counter:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="aiinfra-test-camera-") as directory:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(directory) / "optimized.onnx")
        ort.InferenceSession(onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"])
        return Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


def test_the_cpu_target_pins_the_input_quantization_to_the_camera_bytes(
    cpu_quantization, float_int8
):
    assert cpu_quantization.camera_input
    model = onnx.load_from_string(float_int8)
    (reader,) = [node for node in model.graph.node if INPUT_NAME in node.input]
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert reader.op_type == "QuantizeLinear"
    assert constants[reader.input[1]] == np.float32(1 / 255)
    assert constants[reader.input[2]].dtype == np.uint8 and constants[reader.input[2]] == 0


def test_the_camera_input_engine_takes_uint8_frames_and_reads_them_bit_identically(
    float_int8, camera_int8, held_out
):
    assert camera_int8.applied and "bit-identical" in camera_int8.note
    model = onnx.load_from_string(camera_int8.onnx_bytes)
    assert takes_camera_bytes(model) and not takes_camera_bytes(onnx.load_from_string(float_int8))
    spec = perception_spec()
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [spec.image_height, spec.image_width, 3]
    assert not [
        n for n in model.graph.node if n.op_type == "QuantizeLinear" and INPUT_NAME in n.input
    ]

    camera, plain = (OnnxRuntimeEngine(b, spec) for b in (camera_int8.onnx_bytes, float_int8))
    assert camera.takes_camera_bytes and not plain.takes_camera_bytes
    # Frames the check never saw (held-out drives), through every entry point.
    got, expected = camera.infer(held_out.images), plain.infer(held_out.images)
    for field in ("occupancy", "lead_gap_m", "confidence"):
        assert np.array_equal(getattr(got, field), getattr(expected, field)), field
    inputs = held_out.inputs()[:8]  # run_raw callers holding float inputs keep working
    for got_raw, expected_raw in zip(camera.run_raw(inputs), plain.run_raw(inputs), strict=True):
        assert np.array_equal(got_raw, expected_raw)
    # What onnxruntime runs: no input QuantizeLinear left, fewer layout transposes.
    before, after = _optimized_ops(float_int8), _optimized_ops(camera_int8.onnx_bytes)
    assert after["QuantizeLinear"] < before["QuantizeLinear"]
    assert after["Transpose"] < before["Transpose"]


def test_mining_and_the_layerwise_report_feed_a_camera_input_engine(
    exported, float_int8, camera_int8, held_out, fleet
):
    spec = perception_spec()
    frames = fleet.head(40)
    camera = OnnxRuntimeEngine(camera_int8.onnx_bytes, spec, batch_size=16)
    plain = OnnxRuntimeEngine(float_int8, spec, batch_size=16)
    mined = run_engine_over_frames(camera, frames, spec, chunk_batches=1)
    assert np.array_equal(mined.occupancy, run_engine_over_frames(plain, frames, spec).occupancy)

    sample = held_out.inputs()[:8]
    camera_rows = layerwise_comparison(exported.onnx_bytes, camera_int8.onnx_bytes, sample)
    float_rows = layerwise_comparison(exported.onnx_bytes, float_int8, sample)
    assert not camera_rows.empty
    pd.testing.assert_frame_equal(
        camera_rows.reset_index(drop=True), float_rows.reset_index(drop=True)
    )


def test_graphs_whose_input_is_not_the_camera_bytes_are_left_as_they_are(
    exported, calibration, settings
):
    images = calibration.images[:8]
    fp32 = with_camera_input(exported.onnx_bytes, images)
    assert not fp32.applied and fp32.onnx_bytes == exported.onnx_bytes
    assert "not by one QuantizeLinear" in fp32.note
    # Signed activations (the TensorRT targets' recipe) quantize the input to int8.
    signed = quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization)
    kept = with_camera_input(signed, images)
    assert not kept.applied and kept.onnx_bytes == signed and "int8" in kept.note
    # Unsigned, but with the calibrated range instead of the camera's (not pinned).
    unpinned = replace(
        settings.quantization.for_target(settings.targets["cpu-ci"]), camera_input=False
    )
    dark = calibration.inputs() * np.float32(0.5)  # never brighter than half: scale 0.5/255
    graph = quantize_int8(exported.onnx_bytes, dark, unpinned)
    rewritten, note = rewrite_for_camera_input(graph)
    assert rewritten is None and "not the camera's 1/255" in note


def test_a_rewrite_that_changed_an_output_would_be_refused(float_int8, calibration):
    rewritten, _ = rewrite_for_camera_input(float_int8)
    images = calibration.images[:16]
    require_same_outputs(float_int8, rewritten, images)  # the real rewrite holds
    # The same rewrite with every weight scale nudged: the check must name the difference.
    model = onnx.load_from_string(rewritten)
    for initializer in model.graph.initializer:
        if initializer.data_type == onnx.TensorProto.FLOAT and initializer.name.endswith("scale"):
            values = onnx.numpy_helper.to_array(initializer) * np.float32(1.5)
            initializer.CopyFrom(onnx.numpy_helper.from_array(values, initializer.name))
    with pytest.raises(CameraInputError, match="differs from the graph it replaces"):
        require_same_outputs(float_int8, model.SerializeToString(), images)


def test_camera_input_is_refused_where_the_runtime_cannot_take_it():
    def with_target_quantization(target: str, overrides: dict) -> dict:
        config = copy.deepcopy(load_resource_yaml("deployment.yaml"))
        config["targets"][target]["quantization"] = overrides
        return config

    with pytest.raises(ValueError, match=r"orin\.quantization\.camera_input.*tensorrt"):
        DeploymentSettings.load(with_target_quantization("orin", {"camera_input": True}))
    with pytest.raises(ValueError, match=r"cpu-ci\.quantization\.camera_input.*QInt8"):
        DeploymentSettings.load(
            with_target_quantization("cpu-ci", {"camera_input": True, "activation_type": "QInt8"})
        )
