"""Typed access to ``resources/deployment.yaml`` and the ``deployment`` section of gates.yaml.

Operational knobs (opset, batch sizes, iterations, targets) and gates (budgets) are kept apart
on purpose: an operator tunes the first freely, the second changes what may ship. Each
``load`` takes an optional already-loaded mapping (the whole file) so tests can pass an edited
copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiinfra_pipelines.config import Section, dagster_home, load_resource_yaml, settings_section

CONFIG_FILE = "deployment.yaml"
GATES_FILE = "gates.yaml"
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")
SENSITIVITY_METRICS: tuple[str, ...] = ("output_sqnr_db", "layer_sqnr_db")
QAT_RANGE_INITS: tuple[str, ...] = ("output_mse", "minmax")
# onnxruntime QuantType names the quantizer accepts for activations and weights.
QUANT_TYPES: tuple[str, ...] = ("QInt8", "QUInt8")
# The quantizer settings a target may override (deployment.yaml targets.<name>.quantization).
TARGET_QUANTIZATION: tuple[str, ...] = (
    "activation_type",
    "weight_type",
    "per_channel",
    "preprocess",
    "camera_input",
)


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
    # onnxruntime's quant_pre_process on the FP32 graph first (shared weights behind Identity
    # nodes become initializers again, so every Conv/Gemm can run as a QLinear kernel).
    preprocess: bool = False
    # The INT8 engine takes the camera's uint8 H x W x 3 frames: its input quantization is
    # pinned to the camera's own (scale 1/255, zero point 0, unsigned), so the float input and
    # its QuantizeLinear are replaced by a transpose of the bytes (deployment.camera_input).
    camera_input: bool = False

    def for_target(self, target: DeploymentTarget) -> QuantizationSettings:
        """These settings with the target runtime's quantization options on top."""
        return replace(
            self,
            extra_options={**self.extra_options, **target.quantization_options},
            **dict(target.quantization),
        )


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
    # The precisions the target may run, in order of preference on equal size: the engine
    # shipped is the smallest of them that holds every slice budget (deployment.selection).
    ship_precisions: tuple[str, ...]
    runtime_target: str
    intra_op_threads: int = 0
    compute_capability: str | None = None
    # What the runtime's INT8 kernels require of the QDQ graph (TensorRT: symmetric, float bias).
    quantization_options: Mapping[str, Any] = field(default_factory=dict)
    # QuantizationSettings fields this runtime's kernels want set otherwise (TARGET_QUANTIZATION).
    quantization: Mapping[str, Any] = field(default_factory=dict)


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

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> DeploymentSettings:
        """``deployment.yaml`` (or ``config``, the whole file as a mapping, for tests)."""
        file = settings_section(CONFIG_FILE, "", config)
        export, parity, targets = (
            file.section("export"),
            file.section("parity"),
            file.section("targets"),
        )
        quantization = _quantization(file)
        by_name = {str(name): _target(targets.section(str(name))) for name in targets.values}
        for target in by_name.values():
            _check_camera_input(quantization.for_target(target), target, targets)
        return cls(
            version=file.str("version", ""),
            opset=export.int("opset"),
            parity_frames=_positive(export, "parity_frames"),
            quantization=quantization,
            layerwise_frames=parity.int("layerwise_frames"),
            layerwise_flag_sqnr_db=parity.float("layerwise_flag_sqnr_db"),
            benchmark=_benchmark(file),
            targets=by_name,
            tensorrt=_tensorrt(file),
        )


@dataclass(frozen=True)
class LatencyBudget:
    target: str
    p99_ms_batch1: float
    min_throughput_fps: float
    max_peak_memory_mb: float
    # The car's compute budget for the network, multiply-accumulates per frame
    # (deployment.model_cost); None where the target's hardware has not been measured.
    max_macs_per_frame: float | None = None

    @classmethod
    def load(cls, target: str, gates: Mapping[str, Any] | None = None) -> LatencyBudget:
        """The latency profile of ``target`` in gates.yaml ``deployment.latency``."""
        deployment_gates(gates)  # the section and its parts exist
        profiles = settings_section(GATES_FILE, "deployment.latency", gates)
        if target not in profiles:
            raise profiles.error(
                target,
                f"no profile for this target (profiles: {', '.join(sorted(profiles.values))})",
            )
        profile = profiles.section(target)
        return cls(
            target=target,
            p99_ms_batch1=profile.float("p99_ms_batch1"),
            min_throughput_fps=profile.float("min_throughput_fps"),
            max_peak_memory_mb=profile.float("max_peak_memory_mb"),
            max_macs_per_frame=(
                None
                if profile.raw("max_macs_per_frame", None) is None
                else profile.float("max_macs_per_frame")
            ),
        )


def _target(section: Section) -> DeploymentTarget:
    name = section.path.rsplit(".", 1)[-1]
    capability = section.raw("compute_capability", None)
    return DeploymentTarget(
        name=name,
        backend=section.str("backend"),
        ship_precisions=_ship_precisions(section),
        runtime_target=section.str("runtime_target", name),
        intra_op_threads=section.int("intra_op_threads", 0),
        compute_capability=None if capability is None else str(capability),
        quantization_options=dict(section.section("quantization_options", {}).values),
        quantization=_target_quantization(section.section("quantization", {})),
    )


def _check_camera_input(
    quantization: QuantizationSettings, target: DeploymentTarget, targets: Section
) -> None:
    """Camera-byte input folds the camera's uint8 into an unsigned input quantization that
    onnxruntime runs as is; TensorRT's explicit quantization is signed and binds float inputs."""
    if not quantization.camera_input:
        return
    if target.backend != "onnxruntime" or quantization.activation_type != "QUInt8":
        raise targets.error(
            f"{target.name}.quantization.camera_input",
            "needs an onnxruntime target with activation_type QUInt8 (the camera's unsigned "
            f"bytes), not backend {target.backend} with {quantization.activation_type}",
        )


def _ship_precisions(section: Section) -> tuple[str, ...]:
    """``ship_precisions`` as a tuple; a non-empty list of distinct known precisions."""
    if "ship_precision" in section:
        raise section.error(
            "ship_precision",
            "replaced by ship_precisions, the list of precisions the target may run "
            "(the smallest that holds every slice budget ships), e.g. [int8, fp16]",
        )
    raw = section.raw("ship_precisions", ["int8"])
    if isinstance(raw, str) or not isinstance(raw, list) or not raw:
        raise section.error(
            "ship_precisions", f"must be a non-empty list of precisions {PRECISIONS}, not {raw!r}"
        )
    unknown = [value for value in raw if value not in PRECISIONS]
    if unknown:
        raise section.error("ship_precisions", f"{unknown} not among {PRECISIONS}")
    if len(set(raw)) != len(raw):
        raise section.error("ship_precisions", f"{raw} names a precision twice")
    return tuple(str(value) for value in raw)


def _quant_type(section: Section, key: str) -> str:
    value = section.str(key)
    if value not in QUANT_TYPES:
        raise section.error(key, f"{value!r}: expected one of {', '.join(QUANT_TYPES)}")
    return value


def _target_quantization(section: Section) -> dict[str, Any]:
    unknown = sorted(set(section.values) - set(TARGET_QUANTIZATION))
    if unknown:
        raise section.error(
            unknown[0], f"not a target quantization setting ({', '.join(TARGET_QUANTIZATION)})"
        )
    overrides: dict[str, Any] = {}
    for key in section.values:
        if key in ("activation_type", "weight_type"):
            overrides[key] = _quant_type(section, key)
        else:
            overrides[key] = section.bool(key)
    return overrides


def _quantization(config: Section) -> QuantizationSettings:
    quantization, sensitivity = config.section("quantization"), config.section("sensitivity")
    metric = sensitivity.str("metric")
    if metric not in SENSITIVITY_METRICS:
        raise sensitivity.error(
            "metric", f"{metric!r}: expected one of {', '.join(SENSITIVITY_METRICS)}"
        )
    return QuantizationSettings(
        calibration_batch_size=_positive(quantization, "calibration_batch_size"),
        calibrate_method=quantization.str("calibrate_method"),
        per_channel=quantization.bool("per_channel"),
        activation_type=_quant_type(quantization, "activation_type"),
        weight_type=_quant_type(quantization, "weight_type"),
        fp16_keep_io_types=quantization.bool("fp16_keep_io_types"),
        sensitivity_metric=metric,
        candidate_op_types=tuple(str(op) for op in sensitivity.list("candidate_op_types")),
        extra_options=dict(quantization.section("extra_options", {}).values),
        preprocess=quantization.bool("preprocess", False),
        camera_input=quantization.bool("camera_input", False),
    )


def _benchmark(config: Section) -> BenchmarkSettings:
    bench = config.section("benchmark")
    return BenchmarkSettings(
        iterations=_positive(bench, "iterations"),
        warmup=bench.int("warmup"),
        serving_batch=_positive(bench, "serving_batch"),
        throughput_iterations=bench.int("throughput_iterations"),
        frames=_positive(bench, "frames"),
    )


def _tensorrt(config: Section) -> TensorRTSettings:
    trt = config.section("tensorrt", {})
    cache_dir = str(trt.raw("cache_dir", None) or "")
    return TensorRTSettings(
        cache_dir=Path(cache_dir) if cache_dir else dagster_home() / "tensorrt",
        workspace_mb=trt.int("workspace_mb", 1024),
        max_batch=trt.int("max_batch", 64),
    )


def _positive(section: Section, key: str) -> int:
    value = section.int(key)
    if value < 1:
        raise section.error(key, f"must be >= 1, got {value}")
    return value


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


@dataclass(frozen=True)
class QatSettings:
    """``deployment.yaml`` ``qat``: the quantization-aware fine-tune PTQ falls back to.

    Operational knobs only (how long, how fast, on how many frames): whether the result may
    ship is decided by the same gates.yaml ``deployment.quantization`` budgets as PTQ.
    """

    enabled: bool
    epochs: int
    lr: float
    scale_lr: float  # activation scales (log domain)
    weight_decay: float
    distill_weight: float  # share of the loss taken against the FP32 network's outputs
    batch_size: int
    frames: int  # labelled training frames used (0 = all)
    observer_batch_size: int
    range_search_frames: int
    range_init: str  # one of QAT_RANGE_INITS
    activation_symmetric: bool
    seed: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> QatSettings:
        """``deployment.yaml`` ``qat`` (or ``config``, the whole file as a mapping, for tests)."""
        qat = settings_section(CONFIG_FILE, "qat", config)
        frames = qat.int("frames")
        if frames < 0:
            raise qat.error("frames", f"must be >= 0 (0 = all), got {frames}")
        for key in ("lr", "scale_lr"):
            if not qat.float(key) > 0:
                raise qat.error(key, f"must be > 0, got {qat.float(key)}")
        range_init = qat.str("range_init", "output_mse")
        if range_init not in QAT_RANGE_INITS:
            raise qat.error("range_init", f"{range_init!r}: expected one of {QAT_RANGE_INITS}")
        distill = qat.float("distill_weight")
        if not 0.0 <= distill <= 1.0:
            raise qat.error("distill_weight", f"must be within [0, 1], got {distill}")
        return cls(
            enabled=qat.bool("enabled"),
            epochs=_positive(qat, "epochs"),
            lr=qat.float("lr"),
            scale_lr=qat.float("scale_lr"),
            weight_decay=qat.float("weight_decay", 0.0),
            distill_weight=distill,
            batch_size=_positive(qat, "batch_size"),
            frames=frames,
            observer_batch_size=_positive(qat, "observer_batch_size"),
            range_search_frames=_positive(qat, "range_search_frames"),
            range_init=range_init,
            activation_symmetric=qat.bool("activation_symmetric", False),
            seed=qat.int("seed", 0),
        )
