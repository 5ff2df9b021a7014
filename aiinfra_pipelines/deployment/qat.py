"""Quantization-aware fine-tuning: the INT8 engine for a model PTQ cannot hold within budget.

PTQ (``fallback.mixed_precision_int8``) only chooses ranges and which nodes stay in FP32; when
no allowed fallback holds every slice, the weights themselves must learn to live with INT8
rounding. Here a COPY of the network is fine-tuned with fake quantization in the forward pass
and exported to the same QDQ ONNX the PTQ path produces, then gated by the SAME budgets
(gates.yaml ``deployment.quantization``), against the FP32 engine on the calibration frames,
exactly as the fallback loop gates each of its steps.

What is quantized (what PTQ quantizes and INT8 kernels pay off for):

- the weights of every Conv2d/Linear: symmetric INT8 per output channel, scale = max |w| / 127
  recomputed every step (the weights move; their range follows them);
- the activation entering each of those layers (and the last conv block's output, which
  reaches the trunk through the pool): INT8 per tensor. Ranges start from the calibration
  frames — min/max, then per layer the clip level that minimises the layer's output error
  (``qat.range_init``) — and are then *learned* (LSQ, Esser et al. 2020, with the scale in the
  log domain as TQT trains it: the gradient is the rounding error inside the range and the
  clip level outside it). Learned rather than EMA ranges because the failure QAT is here for
  is usually a range problem: an outlier channel stretches a min/max range until every other
  channel rounds to zero; an EMA of min/max keeps that range forever, whereas a learned scale
  trades clipping the outlier against everyone else's resolution, by the loss.

The fine-tune minimises the project's training loss (``objective.perception_loss``) against
the labels and/or the FP32 network's own outputs (``qat.distill_weight``): the gate measures
agreement with FP32, not only label metrics. After every epoch the engine is exported, run on
onnxruntime and gated; the first epoch that holds the budget ships (epoch 0 = initial ranges).

BatchNorm is folded into the preceding convolution before fine-tuning (statistics frozen), so
the weights being fake-quantized are the weights the exported graph carries — the exporter folds
BN the same way for the FP32 graph. Layers keep their attribute paths, so the exported nodes keep
their names (``/features/features.1/features.1.0/Conv``), as plans and layer-wise reports use.
Fake-quant exports as QuantizeLinear/DequantizeLinear (TorchScript exporter, ``dynamo=False``);
the weight Q/DQ pairs are then folded to INT8 initializers + DequantizeLinear, as PTQ writes them.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.perception.onnx_export import export_onnx
from aiinfra_pipelines.training.objective import (
    loss_weighting,
    occupancy_cell_weights,
    perception_loss,
)

from .export import sha256_hex
from .fallback import (
    MixedPrecisionEngine,
    MixedPrecisionPlan,
    QuantizationBudgetError,
    mixed_precision_int8,
    predict_frames,
)
from .frames import LabelledFrames
from .parity import EngineComparison, compare_with_fp32, slice_metrics
from .settings import QAT_RANGE_INITS, QatSettings, QuantizationSettings

# INT8 as the ONNX exporter accepts it for fake-quant (QuantizeLinear to int8). Weights use the
# symmetric restricted range [-127, 127] (scale = max|w| / 127, zero point 0): -128 is never
# produced, as TensorRT's and onnxruntime's symmetric weight quantization have it.
QMIN, QMAX = -128, 127
WEIGHT_LEVEL = 127.0
_EPS = 1e-12


# -- fake quantization ---------------------------------------------------------------------------


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric INT8 scales: max |w| / 127 (no gradient)."""
    return (weight.detach().abs().flatten(1).amax(dim=1).clamp_min(_EPS) / WEIGHT_LEVEL).float()


def fake_quant_weight(weight: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per-output-channel symmetric INT8 fake-quant (straight-through gradient to ``weight``)."""
    scale = weight_scales(weight) if scale is None else scale
    zero_point = torch.zeros(weight.shape[0], dtype=torch.int32, device=weight.device)
    return torch.fake_quantize_per_channel_affine(weight, scale, zero_point, 0, QMIN, QMAX)


class _FakeQuantLayer:
    """What QuantConv2d and QuantLinear share: the input quantizer and the weight scales.

    Training recomputes the weight scales every step (the weights move); in eval mode they are
    frozen into the ``weight_scale`` buffer when the layer enters eval, so the exported graph
    holds them as constants (QuantizeLinear of an initializer, foldable to INT8 weights) rather
    than a ReduceMax over the weights.
    """

    input_quant: ActivationFakeQuant
    weight: nn.Parameter
    weight_scale: torch.Tensor
    training: bool

    def _raw(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def train(self, mode: bool = True):  # type: ignore[no-untyped-def]
        result = nn.Module.train(self, mode)  # type: ignore[arg-type]
        if not mode:
            self.weight_scale = weight_scales(self.weight)
        return result

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = None if self.training else self.weight_scale
        return self._raw(self.input_quant(x), fake_quant_weight(self.weight, scale))

    def input_error(self, x: torch.Tensor, scale: float) -> float:
        """Mean squared error of this layer's output when its input is quantized at ``scale``
        (weights quantized), against the float layer: what a range costs downstream."""
        with torch.no_grad():
            reference = self._raw(x, self.weight)
            quantized = self._raw(self.input_quant.quantize(x, scale), self.weight_scale_fq())
            return float((quantized - reference).pow(2).mean())

    def weight_scale_fq(self) -> torch.Tensor:
        return fake_quant_weight(self.weight.detach())


class ActivationFakeQuant(nn.Module):
    """Per-tensor INT8 fake-quant of a layer's input with a learned (LSQ) scale.

    Three modes: observing (records min/max, passes the input through), training (LSQ with a
    straight-through rounding, gradients to the input and the scale) and eval/export
    (``torch.fake_quantize_per_tensor_affine`` with the current scale as a constant, which the
    ONNX exporter writes as QuantizeLinear/DequantizeLinear; the same rounding, half to even).
    The zero point is fixed by the observed range (asymmetric) or 0 (symmetric); only the
    scale is learned.
    """

    def __init__(self, symmetric: bool) -> None:
        super().__init__()
        self.symmetric = bool(symmetric)
        # log of the scale: always positive, and Adam's steps are relative (a range 30x too
        # wide needs as many steps as one 30x too narrow), as TQT (Jain et al. 2020) trains it.
        self.log_scale = nn.Parameter(torch.tensor(0.0))
        self.register_buffer("zero_point", torch.tensor(0, dtype=torch.int32))
        self.register_buffer("observed", torch.tensor([float("inf"), float("-inf")]))
        self.observing = False

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()

    @property
    def initialised(self) -> bool:
        return bool(torch.isfinite(self.observed).all())

    def init_from_observed(self) -> None:
        """Scale and zero point from the observed range (always containing 0, as ORT's MinMax)."""
        if not self.initialised:
            raise RuntimeError("an activation quantizer saw no data: its layer never ran")
        low, high = min(float(self.observed[0]), 0.0), max(float(self.observed[1]), 0.0)
        if self.symmetric:
            scale, zero_point = max(abs(low), abs(high)) / QMAX, 0
        else:
            scale = (high - low) / (QMAX - QMIN)
            zero_point = round(QMIN - low / max(scale, _EPS))
        with torch.no_grad():
            self.log_scale.fill_(float(np.log(max(scale, 1e-8))))
            self.zero_point.fill_(min(max(zero_point, QMIN), QMAX))

    def quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """``x`` fake-quantized at ``scale`` and this quantizer's zero point (no gradient to it)."""
        return torch.fake_quantize_per_tensor_affine(x, scale, int(self.zero_point), QMIN, QMAX)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing:
            with torch.no_grad():
                self.observed[0] = torch.minimum(self.observed[0], x.min())
                self.observed[1] = torch.maximum(self.observed[1], x.max())
            return x
        zero_point = int(self.zero_point)
        if not self.training:
            return self.quantize(x, float(self.scale.detach()))
        # LSQ's straight-through estimator: the rounding passes the gradient through, the
        # clamp does not, so the scale learns from both the rounding error and the clipping.
        scale = self.scale
        level = (x / scale + zero_point).clamp(QMIN, QMAX)
        level = level + (torch.round(level) - level).detach()
        return (level - zero_point) * scale


class QuantConv2d(_FakeQuantLayer, nn.Conv2d):
    """A Conv2d whose input and weights are fake-quantized (built by :func:`prepare_qat`)."""

    def _raw(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, weight, self.bias)


class QuantLinear(_FakeQuantLayer, nn.Linear):
    """A Linear whose input and weights are fake-quantized (built by :func:`prepare_qat`)."""

    def _raw(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, weight, self.bias)


def _fold_batchnorms(module: nn.Module) -> int:
    """Fold every BatchNorm2d that directly follows a Conv2d in a Sequential into that conv."""
    folded = 0
    for child in module.modules():
        if not isinstance(child, nn.Sequential):
            continue
        names = list(child._modules)
        for first, second in itertools.pairwise(names):
            conv, norm = child._modules[first], child._modules[second]
            if isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d):
                child._modules[first] = nn.utils.fusion.fuse_conv_bn_eval(conv, norm)
                child._modules[second] = nn.Identity()
                folded += 1
    return folded


def _quantized(layer: nn.Module, symmetric: bool) -> nn.Module:
    if type(layer) is nn.Conv2d:
        new: nn.Module = QuantConv2d.__new__(QuantConv2d)
    elif type(layer) is nn.Linear:
        new = QuantLinear.__new__(QuantLinear)
    else:
        return layer
    new.__dict__ = layer.__dict__.copy()  # same parameters, hooks and hyperparameters
    new._modules = dict(layer._modules)
    new.input_quant = ActivationFakeQuant(symmetric)
    new.register_buffer("weight_scale", weight_scales(new.weight))
    return new


def prepare_qat(net: PerceptionNet, symmetric_activations: bool = False) -> PerceptionNet:
    """A deep copy of ``net`` with BN folded and every Conv2d/Linear fake-quantized, in place
    of the original layers (same attribute paths, so the exported node names do not change)."""
    model = copy.deepcopy(net).eval().cpu()
    _fold_batchnorms(model)
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is not None:
                parent._modules[name] = _quantized(child, symmetric_activations)
    if not list(activation_quantizers(model)):
        raise ValueError(f"{type(net).__name__} has no Conv2d/Linear layer to quantize")
    _quantize_trunk_output(model, symmetric_activations)
    return model


class QuantReLU(nn.ReLU):
    """A ReLU whose output is fake-quantized (same attribute path as the ReLU it replaces)."""

    output_quant: ActivationFakeQuant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_quant(super().forward(x))


def _quantize_trunk_output(model: nn.Module, symmetric: bool) -> None:
    """Quantize the last conv block's ReLU output too, the one tensor between two quantized
    layers that no Conv/Linear reads directly (it reaches the trunk's Linear through the pool).

    Without it the last convolution's output stays float and onnxruntime cannot fuse it into a
    QLinearConv (it needs DequantizeLinear inputs AND a QuantizeLinear output); with it the
    graph has the shape PTQ writes there (QLinearConv, then QLinearAveragePool).
    """
    features = getattr(model, "features", None)
    block = features[-1] if isinstance(features, nn.Sequential) and len(features) else None
    if not isinstance(block, nn.Sequential) or type(block[-1]) is not nn.ReLU:
        return
    relu = QuantReLU(inplace=block[-1].inplace)
    relu.output_quant = ActivationFakeQuant(symmetric)
    block[-1] = relu


def activation_quantizers(model: nn.Module) -> Iterator[ActivationFakeQuant]:
    return (m for m in model.modules() if isinstance(m, ActivationFakeQuant))


# Clip levels the range search tries, as fractions of the min/max range: 1 down to 1/1024 in
# steps of sqrt(2) (the search's resolution, not a threshold: the output error decides).
RANGE_GRID: tuple[float, ...] = tuple(2.0 ** (-k / 2) for k in range(21))


def calibrate_ranges(
    model: nn.Module,
    inputs: np.ndarray,
    batch_size: int,
    search_frames: int,
    method: str = "output_mse",
) -> dict[str, float]:
    """Initialise every activation quantizer on real frames: min/max over ``inputs`` (what
    PTQ's MinMax calibration fixes), then per layer the clip level in :data:`RANGE_GRID` that
    minimises the layer's OUTPUT error on ``search_frames`` of them.

    Why the output and not the tensor: a tensor whose range one outlier channel stretches looks
    best unclipped to a tensor-MSE observer (the outlier dominates the error), while the layer
    reading it may weigh that channel little and need the other channels' resolution. Returns
    the chosen clip fraction per quantized layer (for the record). ``method="minmax"`` stops
    after the first step (the ranges PTQ starts from; training alone must then move them).
    """
    if method not in QAT_RANGE_INITS:
        raise ValueError(f"range init must be one of {QAT_RANGE_INITS}, got {method!r}")
    if len(inputs) == 0:
        raise ValueError("no calibration frames: activation ranges cannot be initialised")
    model.eval()
    with _observing(model):
        _run(model, inputs, batch_size)
    for quantizer in activation_quantizers(model):
        quantizer.init_from_observed()
    layers = {name: m for name, m in model.named_modules() if isinstance(m, _FakeQuantLayer)}
    if method == "minmax":
        return {name: 1.0 for name in layers}
    picks = np.unique(np.linspace(0, len(inputs) - 1, min(search_frames, len(inputs))).round())
    seen = _layer_inputs(model, layers, inputs[picks.astype(int)], batch_size)
    return {name: _search_clip(layer, seen[name]) for name, layer in layers.items()}


@contextlib.contextmanager
def _observing(model: nn.Module) -> Iterator[None]:
    """While open, the activation quantizers record min/max and pass their input through."""
    quantizers = list(activation_quantizers(model))
    for quantizer in quantizers:
        quantizer.observing = True
    try:
        yield
    finally:
        for quantizer in quantizers:
            quantizer.observing = False


def _run(model: nn.Module, frames: np.ndarray, batch_size: int) -> None:
    with torch.no_grad():
        for start in range(0, len(frames), batch_size):
            model(torch.from_numpy(np.ascontiguousarray(frames[start : start + batch_size])))


def _layer_inputs(
    model: nn.Module, layers: Mapping[str, nn.Module], frames: np.ndarray, batch_size: int
) -> dict[str, torch.Tensor]:
    """Each layer's float input on ``frames`` (activations unquantized, weights quantized)."""
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    handles = [
        layer.register_forward_pre_hook(
            lambda _m, args, name=name: seen[name].append(args[0].detach())
        )
        for name, layer in layers.items()
    ]
    try:
        with _observing(model):
            _run(model, frames, batch_size)
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(tensors) for name, tensors in seen.items()}


def _search_clip(layer: _FakeQuantLayer, inputs: torch.Tensor) -> float:
    """Set ``layer``'s input scale to the :data:`RANGE_GRID` clip with the least output error."""
    base = float(layer.input_quant.scale.detach())
    errors = [layer.input_error(inputs, base * fraction) for fraction in RANGE_GRID]
    best = RANGE_GRID[int(np.argmin(errors))]
    with torch.no_grad():
        layer.input_quant.log_scale.fill_(float(np.log(base * best)))
    return best


# -- export ------------------------------------------------------------------------------------


def export_qdq(model: PerceptionNet, opset: int) -> bytes:
    """The fake-quant model as QDQ ONNX (the project's exporter: three outputs, dynamic batch),
    with each weight's QuantizeLinear folded into an INT8 initializer, as PTQ stores weights."""
    return fold_weight_quantization(export_onnx(model.eval(), opset=opset))


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def fold_weight_quantization(onnx_bytes: bytes) -> bytes:
    """QuantizeLinear(float constant) → one INT8 initializer (4x smaller weights, and the graph
    shape runtimes match for INT8 kernels: DequantizeLinear(int8 weight) → Conv/Gemm)."""
    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    constants = _constants(graph)
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    kept, folded = [], []
    for node in graph.node:
        data, scale, zero_point = (list(node.input) + [""] * 3)[:3]
        if node.op_type != "QuantizeLinear" or data not in constants or scale not in constants:
            kept.append(node)
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        values, scales = constants[data].astype(np.float32), constants[scale].astype(np.float32)
        zeros = constants[zero_point] if zero_point else np.zeros_like(scales, dtype=np.uint8)
        if scales.ndim == 1:  # per axis: broadcast scale/zero point along ``axis``
            shape = [1] * values.ndim
            shape[axis] = -1
            scales, zero_values = scales.reshape(shape), zeros.reshape(shape)
        else:
            zero_values = zeros
        info = np.iinfo(zeros.dtype)
        quantized = np.clip(
            np.rint(values / scales) + zero_values.astype(np.int64), info.min, info.max
        )
        tensor = numpy_helper.from_array(quantized.astype(zeros.dtype), node.output[0])
        folded.append(tensor)
    if not folded:
        return onnx_bytes
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(folded)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [init for init in graph.initializer if init.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    dead = [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]
    for node in dead:
        graph.node.remove(node)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def qdq_summary(onnx_bytes: bytes) -> dict[str, Any]:
    """How much of the graph is INT8: Q/DQ counts and which Conv/Gemm have INT8 weights."""
    model = onnx.load_from_string(onnx_bytes)
    int8 = {
        init.name for init in model.graph.initializer if init.data_type == onnx.TensorProto.INT8
    }
    dequantized_int8 = {
        node.output[0]
        for node in model.graph.node
        if node.op_type == "DequantizeLinear" and node.input[0] in int8
    }
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    layers = [n for n in model.graph.node if n.op_type in {"Conv", "Gemm", "MatMul"}]
    return {
        "quantize_linear": sum(n.op_type == "QuantizeLinear" for n in model.graph.node),
        "dequantize_linear": sum(n.op_type == "DequantizeLinear" for n in model.graph.node),
        "layers": len(layers),
        "int8_layers": sorted(
            n.name
            for n in layers
            if len(n.input) > 1 and n.input[0] in dequantized and n.input[1] in dequantized_int8
        ),
    }


# -- the fine-tune -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QatEngine:
    int8_onnx: bytes
    sha256: str
    comparison: EngineComparison  # the shipped epoch's comparison on the calibration frames
    record: dict[str, Any] = field(default_factory=dict)


class QatBudgetError(QuantizationBudgetError):
    """Quantization-aware fine-tuning did not bring every gated slice within budget either.

    A :class:`QuantizationBudgetError`, so a caller that treats "no INT8 engine can ship" as
    one failure keeps doing so; ``plan`` is PTQ's plan when PTQ ran first (else None).
    """

    def __init__(self, message: str, record: dict[str, Any], plan: Any = None) -> None:
        ValueError.__init__(self, message)
        self.plan = plan
        self.record = record


def _loss_config(loss: Mapping[str, Any] | None) -> dict[str, Any]:
    if loss is None:
        from aiinfra_pipelines.training.settings import load_training_config

        loss = load_training_config()["loss"]
    return dict(loss)


class _Trainer:
    """One fine-tune: the project's training loss (``objective.perception_loss`` with the cell
    weighting of training.yaml ``loss``), AdamW, seeded batch order; no augmentation (a short
    fine-tune that must stay close to the model it starts from).

    The loss is taken twice and mixed by ``settings.distill_weight``: against the labels, and
    against the FP32 network's own outputs (occupancy probabilities as soft BCE targets, its
    lead gap as the gap target) — self-distillation. The gate compares the INT8 engine with
    FP32 (label-metric drops AND agreement with FP32's decisions), so an engine that fits the
    labels differently from FP32 fails it as surely as one that fits them worse.
    """

    def __init__(
        self,
        model: PerceptionNet,
        teacher: PerceptionNet,
        frames: LabelledFrames,
        settings: QatSettings,
        loss: Mapping[str, Any],
        spec: PerceptionSpec,
    ) -> None:
        weighting = loss_weighting({"loss": loss})
        self.model, self.settings = model, settings
        self.lead_gap_weight = float(loss["lead_gap_weight"])
        self.smooth_l1_beta = float(loss["smooth_l1_beta"])
        self.pos_weight = weighting.pop("pos_weight")
        self.cell_weights = occupancy_cell_weights(spec.bin_edges_m, **weighting)
        self.images = torch.from_numpy(frames.inputs())
        self.occupancy = torch.from_numpy(frames.occupancy_target.astype(np.float32))
        self.lead_gap = torch.from_numpy(frames.lead_gap_target.astype(np.float32)).reshape(-1, 1)
        with torch.no_grad():
            teacher = teacher.eval()
            outputs = [teacher(batch) for batch in self.images.split(settings.observer_batch_size)]
        self.teacher_occupancy = torch.sigmoid(torch.cat([o[0] for o in outputs]))
        self.teacher_gap = torch.cat([o[1] for o in outputs])
        scales = [q.log_scale for q in activation_quantizers(model)]
        scale_ids = {id(p) for p in scales}
        weights = [p for p in model.parameters() if id(p) not in scale_ids]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": weights, "weight_decay": settings.weight_decay},
                {"params": scales, "weight_decay": 0.0, "lr": settings.scale_lr},
            ],
            lr=settings.lr,
        )
        self.generator = torch.Generator().manual_seed(settings.seed)

    def epoch(self) -> float:
        """One pass over the frames; the mean training loss."""
        self.model.train()
        order = torch.randperm(len(self.images), generator=self.generator)
        total, count = 0.0, 0
        for batch in order.split(self.settings.batch_size):
            logits, gap = self.model(self.images[batch])
            labels = self._loss(logits, gap, self.occupancy[batch], self.lead_gap[batch])
            fp32 = self._loss(logits, gap, self.teacher_occupancy[batch], self.teacher_gap[batch])
            weight = self.settings.distill_weight
            loss = (1.0 - weight) * labels + weight * fp32
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total, count = total + float(loss.detach()) * len(batch), count + len(batch)
        self.model.eval()
        return total / max(count, 1)

    def _loss(
        self,
        logits: torch.Tensor,
        gap: torch.Tensor,
        occupancy: torch.Tensor,
        lead_gap: torch.Tensor,
    ) -> torch.Tensor:
        total, _, _ = perception_loss(
            logits,
            gap,
            occupancy,
            lead_gap,
            lead_gap_weight=self.lead_gap_weight,
            smooth_l1_beta=self.smooth_l1_beta,
            cell_weights=self.cell_weights,
            pos_weight=self.pos_weight,
        )
        return total


def qat_int8(
    net: PerceptionNet,
    train_frames: LabelledFrames,
    calibration: LabelledFrames,
    settings: QatSettings,
    budget_section: Mapping[str, Any],
    spec: PerceptionSpec,
    *,
    opset: int,
    fp32_onnx: bytes | None = None,
    loss: Mapping[str, Any] | None = None,
) -> QatEngine:
    """Fine-tune a fake-quant copy of ``net`` until its QDQ engine holds ``budget_section``.

    ``budget_section`` is gates.yaml ``deployment.quantization`` (as for PTQ); the comparison
    is against the FP32 engine (``fp32_onnx``, else ``net`` exported at ``opset``) on the
    ``calibration`` frames. Epoch 0 is the engine straight after range initialisation; after
    each of at most ``settings.epochs`` epochs on ``train_frames`` the engine is exported,
    run on onnxruntime and compared; the first that passes is returned. ``loss`` is
    training.yaml ``loss`` (read when None). ``net`` itself is never modified. Raises
    :class:`QatBudgetError` with the record when no epoch passes.
    """
    if len(train_frames) == 0:
        raise ValueError("no labelled training frames: QAT has nothing to fine-tune on")
    if len(calibration) == 0:
        raise ValueError("no calibration frames: QAT ranges and its gate need real frames")
    started = time.perf_counter()
    if settings.frames and len(train_frames) > settings.frames:
        train_frames = train_frames.spread(settings.frames)
    fp32_onnx = fp32_onnx if fp32_onnx is not None else export_onnx(net.eval(), opset=opset)
    reference = predict_frames(fp32_onnx, calibration, spec)
    fp32_table = slice_metrics(calibration, reference, reference, spec)

    model = prepare_qat(net, settings.activation_symmetric)
    clips = calibrate_ranges(
        model,
        calibration.inputs(),
        settings.observer_batch_size,
        settings.range_search_frames,
        settings.range_init,
    )
    trainer = _Trainer(model, net, train_frames, settings, _loss_config(loss), spec)

    steps: list[dict[str, Any]] = []

    def evaluate(epoch: int, train_loss: float | None) -> tuple[bytes, EngineComparison]:
        int8 = export_qdq(model, opset)
        predictions = predict_frames(int8, calibration, spec)
        table = slice_metrics(calibration, predictions, reference, spec)
        comparison = compare_with_fp32("qat-int8", table, fp32_table, budget_section)
        steps.append(
            {
                "epoch": epoch,
                "train_loss": None if train_loss is None else round(train_loss, 6),
                "passed": comparison.passed,
                "failures": comparison.failures,
                "worst": comparison.worst(),
                "drops": comparison.gated_drops(),
            }
        )
        return int8, comparison

    int8, comparison = evaluate(0, None)
    epoch = 0
    while not comparison.passed and epoch < settings.epochs:
        epoch += 1
        int8, comparison = evaluate(epoch, trainer.epoch())
    record = {
        "passed": comparison.passed,
        "epochs": epoch,
        "max_epochs": settings.epochs,
        "losses": [step["train_loss"] for step in steps if step["train_loss"] is not None],
        "steps": steps,
        "train_frames": len(train_frames),
        "calibration_frames": len(calibration),
        "lr": settings.lr,
        "batch_size": settings.batch_size,
        "scale_lr": settings.scale_lr,
        "distill_weight": settings.distill_weight,
        "activation_symmetric": settings.activation_symmetric,
        "range_init": settings.range_init,
        "initial_clip": {name: round(value, 6) for name, value in clips.items()},
        "activation_scales": {
            name.removesuffix(".input_quant"): round(float(module.scale.detach()), 8)
            for name, module in model.named_modules()
            if isinstance(module, ActivationFakeQuant)
        },
        "qdq": qdq_summary(int8),
        "seconds": round(time.perf_counter() - started, 2),
    }
    if not comparison.passed:
        shown = "; ".join(comparison.failures[:5])
        more = f" (+{len(comparison.failures) - 5} more)" if len(comparison.failures) > 5 else ""
        raise QatBudgetError(
            f"QAT INT8 engine still breaches the per-slice budget on {len(calibration)} "
            f"calibration frames after {epoch} fine-tuning epoch(s) (deployment.yaml "
            f"qat.epochs = {settings.epochs}): {shown}{more}",
            record,
        )
    return QatEngine(int8_onnx=int8, sha256=sha256_hex(int8), comparison=comparison, record=record)


# -- PTQ first, QAT when PTQ cannot hold the budget -----------------------------------------------


@dataclass(frozen=True)
class Int8Result:
    """The INT8 engine that holds the budget, which path made it, and both paths' records."""

    path: str  # "ptq" | "qat"
    int8_onnx: bytes
    sha256: str
    comparison: EngineComparison
    ptq: dict[str, Any]  # the mixed-precision plan (+ "error" when PTQ failed)
    qat: dict[str, Any] | None  # the QAT record when QAT ran
    ptq_engine: MixedPrecisionEngine | None = None
    # PTQ's fallback plan on either path (on the QAT path: the plan that could not hold).
    ptq_plan: MixedPrecisionPlan | None = None

    def summary(self) -> str:
        """One line for a report: what PTQ did, and what QAT did when it had to."""
        if self.path == "ptq":
            return f"PTQ passed with {len(self.ptq.get('fp32_nodes', []))} FP32 fallback node(s)"
        worst = (self.ptq.get("steps") or [{}])[-1].get("worst") or {}
        breach = (
            f"{worst.get('slice')} {worst.get('metric')} by {worst.get('drop')} "
            f"(budget {worst.get('budget')})"
            if worst
            else "the budget"
        )
        epochs = (self.qat or {}).get("epochs")
        how = (
            "on its range initialisation alone (epoch 0)"
            if epochs == 0
            else f"after {epochs} fine-tuning epoch(s)"
        )
        return f"PTQ failed {breach}; QAT passed {how}"


def int8_with_qat_fallback(
    qat_inputs: Callable[[], tuple[PerceptionNet, LabelledFrames]],
    fp32_onnx: bytes,
    calibration: LabelledFrames,
    quantization: QuantizationSettings,
    qat: QatSettings,
    budget_section: Mapping[str, Any],
    spec: PerceptionSpec,
    *,
    opset: int,
    loss: Mapping[str, Any] | None = None,
) -> Int8Result:
    """PTQ with sensitivity fallback first; on :class:`QuantizationBudgetError`, QAT.

    ``qat_inputs()`` gives the trained network and its labelled training frames; it is called
    only when QAT has to run (loading a registered model and decoding a training set costs
    more than the PTQ that usually passes). ``fp32_onnx`` must be that network's FP32 export
    (both paths are compared with it). With
    ``qat.enabled`` false the PTQ error propagates; a QAT breach raises :class:`QatBudgetError`
    carrying PTQ's plan and the QAT record.
    """
    try:
        engine = mixed_precision_int8(fp32_onnx, calibration, quantization, budget_section, spec)
    except QuantizationBudgetError as ptq_error:
        if not qat.enabled:
            raise
        ptq_record = {**ptq_error.plan.to_dict(), "error": str(ptq_error)}
        net, train_frames = qat_inputs()
        try:
            qat_engine = qat_int8(
                net,
                train_frames,
                calibration,
                qat,
                budget_section,
                spec,
                opset=opset,
                fp32_onnx=fp32_onnx,
                loss=loss,
            )
        except QatBudgetError as qat_error:
            raise QatBudgetError(
                f"PTQ failed ({ptq_error}); then {qat_error}", qat_error.record, ptq_error.plan
            ) from qat_error
        return Int8Result(
            path="qat",
            int8_onnx=qat_engine.int8_onnx,
            sha256=qat_engine.sha256,
            comparison=qat_engine.comparison,
            ptq=ptq_record,
            qat=qat_engine.record,
            ptq_plan=ptq_error.plan,
        )
    return Int8Result(
        path="ptq",
        int8_onnx=engine.int8_onnx,
        sha256=engine.sha256,
        comparison=engine.comparison,
        ptq=engine.plan.to_dict(),
        qat=None,
        ptq_engine=engine,
        ptq_plan=engine.plan,
    )
