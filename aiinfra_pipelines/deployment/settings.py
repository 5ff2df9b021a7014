"""Typed access to ``resources/deployment.yaml`` and the ``deployment`` section of gates.yaml.

Operational knobs (opset, batch sizes, iterations, targets) and gates (budgets) are kept apart
on purpose: an operator tunes the first freely, the second changes what may ship. Functions
take an optional already-loaded mapping so tests can pass an edited copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiinfra_pipelines.config import dagster_home, load_resource_yaml

CONFIG_FILE = "deployment.yaml"
GATES_FILE = "gates.yaml"
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
SENSITIVITY_METRICS: tuple[str, ...] = ("output_sqnr_db", "layer_sqnr_db")


@dataclass(frozen=True)
class QuantizationSettings:
    calibration_batch_size: int
    calibrate_method: str
    per_channel: bool
    activation_type: str
    weight_type: str
    fp16_keep_io_types: bool
    sensitivity_metric: str
    candidate_op_types: tuple[str, ...]
    # onnxruntime quantize_static extra_options (ActivationSymmetric, QuantizeBias, ...)
    extra_options: Mapping[str, Any] = field(default_factory=dict)

    def for_target(self, target: DeploymentTarget) -> QuantizationSettings:
        """These settings with the target runtime's quantization options on top."""
        return replace(self, extra_options={**self.extra_options, **target.quantization_options})


@dataclass(frozen=True)
class BenchmarkSettings:
    iterations: int
    warmup: int
    serving_batch: int
    throughput_iterations: int
    frames: int


@dataclass(frozen=True)
class DeploymentTarget:
    """Where the shipped engine runs, and so where its latency must be measured."""

    name: str
    backend: str
    ship_precision: str
    runtime_target: str
    intra_op_threads: int = 0
    compute_capability: str | None = None
    # What the runtime's INT8 kernels require of the QDQ graph (TensorRT: symmetric, float bias).
    quantization_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorRTSettings:
    cache_dir: Path
    workspace_mb: int
    max_batch: int


@dataclass(frozen=True)
class DeploymentSettings:
    version: str
    opset: int
    parity_frames: int
    quantization: QuantizationSettings
    layerwise_frames: int
    layerwise_flag_sqnr_db: float
    benchmark: BenchmarkSettings
    targets: Mapping[str, DeploymentTarget]
    tensorrt: TensorRTSettings


@dataclass(frozen=True)
class LatencyBudget:
    target: str
    p99_ms_batch1: float
    min_throughput_fps: float
    max_peak_memory_mb: float


def _target(name: str, raw: Mapping[str, Any]) -> DeploymentTarget:
    precision = str(raw.get("ship_precision", "int8"))
    if precision not in PRECISIONS:
        raise ValueError(
            f"{CONFIG_FILE} targets.{name}.ship_precision={precision!r}: not a precision"
        )
    capability = raw.get("compute_capability")
    return DeploymentTarget(
        name=name,
        backend=str(raw["backend"]),
        ship_precision=precision,
        runtime_target=str(raw.get("runtime_target", name)),
        intra_op_threads=int(raw.get("intra_op_threads", 0)),
        compute_capability=None if capability is None else str(capability),
        quantization_options=dict(raw.get("quantization_options") or {}),
    )


def deployment_settings(config: Mapping[str, Any] | None = None) -> DeploymentSettings:
    """Parse ``deployment.yaml`` (or an already loaded mapping)."""
    config = config if config is not None else load_resource_yaml(CONFIG_FILE)
    quantization, sensitivity = config["quantization"], config["sensitivity"]
    metric = str(sensitivity["metric"])
    if metric not in SENSITIVITY_METRICS:
        raise ValueError(
            f"{CONFIG_FILE} sensitivity.metric={metric!r}: expected one of "
            f"{', '.join(SENSITIVITY_METRICS)}"
        )
    bench = config["benchmark"]
    trt = config.get("tensorrt") or {}
    cache_dir = str(trt.get("cache_dir") or "")
    settings = DeploymentSettings(
        version=str(config.get("version", "")),
        opset=int(config["export"]["opset"]),
        parity_frames=int(config["export"]["parity_frames"]),
        quantization=QuantizationSettings(
            calibration_batch_size=int(quantization["calibration_batch_size"]),
            calibrate_method=str(quantization["calibrate_method"]),
            per_channel=bool(quantization["per_channel"]),
            activation_type=str(quantization["activation_type"]),
            weight_type=str(quantization["weight_type"]),
            fp16_keep_io_types=bool(quantization["fp16_keep_io_types"]),
            sensitivity_metric=metric,
            candidate_op_types=tuple(str(op) for op in sensitivity["candidate_op_types"]),
            extra_options=dict(quantization.get("extra_options") or {}),
        ),
        layerwise_frames=int(config["parity"]["layerwise_frames"]),
        layerwise_flag_sqnr_db=float(config["parity"]["layerwise_flag_sqnr_db"]),
        benchmark=BenchmarkSettings(
            iterations=int(bench["iterations"]),
            warmup=int(bench["warmup"]),
            serving_batch=int(bench["serving_batch"]),
            throughput_iterations=int(bench["throughput_iterations"]),
            frames=int(bench["frames"]),
        ),
        targets={name: _target(str(name), raw) for name, raw in config["targets"].items()},
        tensorrt=TensorRTSettings(
            cache_dir=Path(cache_dir) if cache_dir else dagster_home() / "tensorrt",
            workspace_mb=int(trt.get("workspace_mb", 1024)),
            max_batch=int(trt.get("max_batch", 64)),
        ),
    )
    for name, value in (
        ("export.parity_frames", settings.parity_frames),
        ("quantization.calibration_batch_size", settings.quantization.calibration_batch_size),
        ("benchmark.iterations", settings.benchmark.iterations),
        ("benchmark.serving_batch", settings.benchmark.serving_batch),
        ("benchmark.frames", settings.benchmark.frames),
    ):
        if value < 1:
            raise ValueError(f"{CONFIG_FILE} {name} must be >= 1, got {value}")
    return settings


def deployment_gates(gates: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The ``deployment`` section of gates.yaml (or of an already loaded mapping)."""
    gates = gates if gates is not None else load_resource_yaml(GATES_FILE)
    section = gates.get("deployment")
    if not section:
        raise ValueError(f"{GATES_FILE} has no deployment section: no engine can be gated")
    for part in ("export", "quantization", "parity", "latency"):
        if part not in section:
            raise ValueError(f"{GATES_FILE} deployment.{part} is missing")
    return section


def export_tolerance(gates: Mapping[str, Any] | None = None) -> float:
    return float(deployment_gates(gates)["export"]["max_abs_error"])


def latency_budget(target: str, gates: Mapping[str, Any] | None = None) -> LatencyBudget:
    """The latency profile of ``target`` in gates.yaml ``deployment.latency``."""
    profiles = deployment_gates(gates)["latency"]
    if target not in profiles:
        raise ValueError(
            f"{GATES_FILE} deployment.latency has no profile for target {target!r} "
            f"(profiles: {', '.join(sorted(profiles))})"
        )
    raw = profiles[target]
    return LatencyBudget(
        target=target,
        p99_ms_batch1=float(raw["p99_ms_batch1"]),
        min_throughput_fps=float(raw["min_throughput_fps"]),
        max_peak_memory_mb=float(raw["max_peak_memory_mb"]),
    )


def environment_target(
    settings: DeploymentSettings, environment: Mapping[str, Any] | None = None
) -> DeploymentTarget:
    """The target the environment (``AIINFRA_ENV``) names in ``deployment.target``."""
    if environment is None:
        from aiinfra_pipelines.environment import load_environment

        environment = load_environment()
    name = str((environment.get("deployment") or {}).get("target", ""))
    if not name:
        raise ValueError("the environment file names no deployment.target")
    if name not in settings.targets:
        raise ValueError(
            f"deployment target {name!r} is not defined in {CONFIG_FILE} targets "
            f"({', '.join(sorted(settings.targets))})"
        )
    return settings.targets[name]
