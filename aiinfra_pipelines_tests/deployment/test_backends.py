"""Engine backends behind one interface: the factory, onnxruntime, and TensorRT where it runs."""

from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.deployment.backends import (
    BACKENDS,
    BackendUnavailableError,
    available_backends,
    backend_status,
    create_engine,
    resolve_backend,
)
from aiinfra_pipelines.deployment.backends.tensorrt import (
    IncompatiblePlanError,
    Platform,
    TensorRTError,
    read_plan_file,
    tensorrt_quantization_problems,
    write_plan_file,
)
from aiinfra_pipelines.deployment.quantize import convert_fp16, quantize_int8
from aiinfra_pipelines.deployment.settings import (
    DeploymentSettings,
    LatencyBudget,
    environment_target,
)
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

TENSORRT_AVAILABLE, TENSORRT_REASON = BACKENDS["tensorrt"].is_available()
requires_tensorrt = pytest.mark.skipif(not TENSORRT_AVAILABLE, reason=TENSORRT_REASON)


def test_the_factory_builds_an_onnxruntime_engine_behind_the_engine_interface(exported, held_out):
    spec = perception_spec()
    engine = create_engine(exported.onnx_bytes, spec, backend="onnxruntime", precision="fp32")
    assert "onnxruntime" in available_backends()
    assert engine.name == "onnxruntime-fp32" and engine.sha256 == exported.sha256
    direct = OnnxRuntimeEngine(exported.onnx_bytes, spec).infer(held_out.images[:5])
    got = engine.infer(held_out.images[:5])
    np.testing.assert_array_equal(got.occupancy, direct.occupancy)
    np.testing.assert_array_equal(got.lead_gap_m, direct.lead_gap_m)
    assert engine.infer(held_out.images[:0]).occupancy.shape == (0, 3, spec.bins)


def test_unknown_and_unavailable_backends_are_refused_with_the_reason(exported):
    with pytest.raises(ValueError, match="unknown engine backend 'tvm'"):
        create_engine(exported.onnx_bytes, perception_spec(), backend="tvm")
    status = backend_status()
    assert status["onnxruntime"].startswith("available")
    if not TENSORRT_AVAILABLE:
        assert status["tensorrt"].startswith("unavailable")
        with pytest.raises(BackendUnavailableError, match="tensorrt") as failure:
            create_engine(exported.onnx_bytes, perception_spec(), backend="tensorrt")
        assert failure.value.reason == TENSORRT_REASON
        assert resolve_backend("auto") == "onnxruntime"
    else:
        assert resolve_backend("auto") == "tensorrt"


def test_a_plan_built_for_another_gpu_or_tensorrt_is_refused_clearly():
    plan = b"\x00serialized-engine\x01"
    header = {"tensorrt_version": "10.3.0", "compute_capability": "8.7", "device_name": "Orin"}
    data = write_plan_file(plan, header)
    read_header, read_plan = read_plan_file(data, Platform("10.3.0", "8.7", "Orin"))
    assert read_plan == plan and read_header["plan_sha256"] == hashlib.sha256(plan).hexdigest()
    with pytest.raises(IncompatiblePlanError, match=r"compute capability 8\.7.*9\.0"):
        read_plan_file(data, Platform("10.3.0", "9.0", "NVIDIA H200"))
    with pytest.raises(IncompatiblePlanError, match=r"TensorRT 10\.3\.0"):
        read_plan_file(data, Platform("10.13.0", "8.7", "Orin"))
    with pytest.raises(TensorRTError, match="corrupt"):
        read_plan_file(data[:-1] + b"\x02", None)
    with pytest.raises(TensorRTError, match="not an aiinfra TensorRT plan"):
        read_plan_file(plan, None)


def test_only_symmetric_float_bias_qdq_graphs_go_to_tensorrt(exported, calibration, settings):
    cpu_tuned = quantize_int8(exported.onnx_bytes, calibration.inputs(), settings.quantization)
    problems = tensorrt_quantization_problems(cpu_tuned)
    assert any("asymmetric" in p for p in problems) and any("int32" in p for p in problems)
    orin = settings.quantization.for_target(settings.targets["orin"])
    for_tensorrt = quantize_int8(exported.onnx_bytes, calibration.inputs(), orin)
    assert tensorrt_quantization_problems(for_tensorrt) == []


def test_the_environment_picks_a_target_with_a_latency_profile():
    settings = DeploymentSettings.load()
    target = environment_target(settings, {"deployment": {"target": "cpu-ci"}})
    assert target.backend == "onnxruntime" and target.ship_precisions[0] == "int8"
    assert LatencyBudget.load(target.name).p99_ms_batch1 > 0
    for name in settings.targets:
        LatencyBudget.load(name)  # every target has a profile in gates.yaml
    with pytest.raises(ValueError, match="'mars-rover' is not defined"):
        environment_target(settings, {"deployment": {"target": "mars-rover"}})
    with pytest.raises(ValueError, match=r"no deployment\.target"):
        environment_target(settings, {})


def test_a_target_overrides_only_the_quantizer_settings_its_kernels_need():
    settings = DeploymentSettings.load()
    cpu = settings.quantization.for_target(settings.targets["cpu-ci"])
    assert cpu.activation_type == "QUInt8" and cpu.preprocess
    for name in ("gpu-ci", "orin"):  # TensorRT's explicit quantization is signed INT8 only
        tensorrt = settings.quantization.for_target(settings.targets[name])
        assert tensorrt.activation_type == "QInt8" and tensorrt.weight_type == "QInt8"
    assert settings.quantization.activation_type == "QInt8"  # the targets' own, not global

    def with_cpu_quantization(overrides: dict) -> dict:
        config = copy.deepcopy(load_resource_yaml("deployment.yaml"))
        config["targets"]["cpu-ci"]["quantization"] = overrides
        return config

    with pytest.raises(ValueError, match=r"cpu-ci\.quantization\.calibrate_method.*not a target"):
        DeploymentSettings.load(with_cpu_quantization({"calibrate_method": "Entropy"}))
    with pytest.raises(ValueError, match=r"activation_type.*'UInt4'.*QInt8, QUInt8"):
        DeploymentSettings.load(with_cpu_quantization({"activation_type": "UInt4"}))
    with pytest.raises(ValueError, match=r"quantization\.activation_type.*'int8'"):
        config = copy.deepcopy(load_resource_yaml("deployment.yaml"))
        config["quantization"]["activation_type"] = "int8"
        DeploymentSettings.load(config)


def test_a_target_lists_the_precisions_it_may_ship_and_refuses_malformed_lists():
    settings = DeploymentSettings.load()
    assert settings.targets["cpu-ci"].ship_precisions == ("int8", "fp16", "fp32")
    for name in ("gpu-ci", "orin"):  # FP32 is no car engine on TensorRT
        assert settings.targets[name].ship_precisions == ("int8", "fp16")

    def with_cpu_target(**keys) -> dict:
        config = copy.deepcopy(load_resource_yaml("deployment.yaml"))
        config["targets"]["cpu-ci"].update(keys)
        return config

    with pytest.raises(ValueError, match=r"cpu-ci\.ship_precision: replaced by ship_precisions"):
        DeploymentSettings.load(with_cpu_target(ship_precision="int8"))
    with pytest.raises(ValueError, match=r"ship_precisions: \['int4'\] not among"):
        DeploymentSettings.load(with_cpu_target(ship_precisions=["int8", "int4"]))
    with pytest.raises(ValueError, match=r"ship_precisions: must be a non-empty list"):
        DeploymentSettings.load(with_cpu_target(ship_precisions="int8"))
    with pytest.raises(ValueError, match=r"ship_precisions: must be a non-empty list"):
        DeploymentSettings.load(with_cpu_target(ship_precisions=[]))
    with pytest.raises(ValueError, match=r"names a precision twice"):
        DeploymentSettings.load(with_cpu_target(ship_precisions=["int8", "int8"]))


@requires_tensorrt
def test_tensorrt_engines_build_run_and_match_fp32(
    exported, held_out, calibration, settings, tmp_path
):
    spec = perception_spec()
    reference = OnnxRuntimeEngine(exported.onnx_bytes, spec).infer(held_out.images)
    for_tensorrt = settings.quantization.for_target(settings.targets["gpu-ci"])
    engines = {
        "fp32": exported.onnx_bytes,
        "fp16": convert_fp16(exported.onnx_bytes),
        "int8": quantize_int8(exported.onnx_bytes, calibration.inputs(), for_tensorrt),
    }
    tolerance = {"fp32": 1e-3, "fp16": 2e-2, "int8": 0.2}  # max |Δ probability| vs FP32
    options = {"cache_dir": tmp_path, "opt_batch": 16, "max_batch": 32, "batch_size": 32}
    plans = {}
    for precision, onnx_bytes in engines.items():
        engine = create_engine(onnx_bytes, spec, backend="tensorrt", precision=precision, **options)
        assert engine.backend == "tensorrt" and engine.precision == precision
        assert engine.header["compute_capability"] and engine.header["tensorrt_version"]
        assert engine.onnx_sha256 == hashlib.sha256(onnx_bytes).hexdigest()
        got = engine.infer(held_out.images)  # several batches, the last one partial
        error = float(np.abs(got.occupancy - reference.occupancy).max())
        assert error <= tolerance[precision], (precision, error)
        assert engine.device_memory_bytes > 0
        plans[precision] = engine.sha256
    assert len(list(tmp_path.glob("timing-*.cache"))) == 1
    assert len(list(tmp_path.glob("plans/*.plan"))) == 3
    # A second engine for the same ONNX loads the persisted plan instead of rebuilding.
    again = create_engine(engines["fp32"], spec, backend="tensorrt", precision="fp32", **options)
    assert again.sha256 == plans["fp32"]
    assert len(list(tmp_path.glob("plans/*.plan"))) == 3
