"""Structured (output-channel) pruning of the car-side network, guarded per slice.

Unstructured sparsity leaves every tensor its shape and buys nothing on the car's engine; whole
channels removed make every convolution, BatchNorm and the trunk's first Linear genuinely
smaller (fewer parameters and multiply-accumulates) and the result still exports to ONNX as
the same graph, only narrower. The network stays a ``PerceptionNet`` (its submodules are
replaced in place), so training, export, evaluation and mining take it unchanged.

Pruning costs accuracy unevenly: the channels that matter for night or fog frames are few and
their filters need not be large, so a step can hold the average and lose a rare condition.
``prune_with_slice_guard`` therefore judges each step (pruned, then fine-tuned with the project's
training recipe) by the per-slice evaluation the offline gate uses and stops at the step before
the first one that drops any gated row (``gates.yaml`` ``pruning``) beyond its budget against
the unpruned model, naming the row and metric that stopped it.

Lives in ``deployment`` (compression for the car) because it needs both earlier layers: the
training recipe for the fine-tunes and ``evaluation``'s per-slice metrics and budget rules, so
a pruned network is judged by exactly the numbers the offline gate applies. Settings are in
``deployment.yaml`` ``pruning`` (not training.yaml: a training run logs every training.yaml key
as an MLflow parameter and refuses to resume when one changed). Plain functions, no Dagster:
an asset calls ``prune_with_slice_guard``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.evaluation.compare import HIGHER_IS_BETTER, budget_for
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.evaluation.slices import METRIC_COLUMNS, OVERALL
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.training.settings import load_training_config

from .model_cost import count_macs, count_parameters

CONFIG_FILE = "deployment.yaml"
GATES_FILE = "gates.yaml"
CRITERIA: tuple[str, ...] = ("l1_bn", "l1", "bn_scale")
GRID_GROUP = "grid_head.detect_features"

# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruningSettings:
    """``deployment.yaml`` ``pruning``: how much is cut per step, how often, how it is chosen."""

    fraction_per_step: float
    max_steps: int
    fine_tune_epochs: int
    lr_scale: float
    criterion: str
    min_channels: int
    prune_grid_head: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction_per_step < 1.0:
            raise ValueError(f"fraction_per_step must be in (0, 1), got {self.fraction_per_step}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.fine_tune_epochs < 0:
            raise ValueError(f"fine_tune_epochs must be >= 0, got {self.fine_tune_epochs}")
        if not self.lr_scale > 0.0:
            raise ValueError(f"lr_scale must be > 0, got {self.lr_scale}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if self.min_channels < 1:
            raise ValueError(f"min_channels must be >= 1, got {self.min_channels}")

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> PruningSettings:
        """From ``deployment.yaml`` (or ``config``, the whole file); errors name file and key."""
        section = settings_section(CONFIG_FILE, "pruning", config)
        try:
            return cls(
                fraction_per_step=section.float("fraction_per_step"),
                max_steps=section.int("max_steps"),
                fine_tune_epochs=section.int("fine_tune_epochs"),
                lr_scale=section.float("lr_scale"),
                criterion=section.str("criterion"),
                min_channels=section.int("min_channels"),
                prune_grid_head=section.bool("prune_grid_head", True),
            )
        except ValueError as error:
            if isinstance(error, KeyError):  # SettingsError: already names file and key
                raise
            raise ValueError(f"resources/{CONFIG_FILE}: pruning: {error}") from None


@dataclass(frozen=True)
class PruningBudgets:
    """``gates.yaml`` ``deployment.pruning``: which rows are gated and how far each may drop.

    ``budgets``/``slice_overrides`` follow the offline gate's rules (``evaluation.compare.
    budget_for``: first fnmatch override wins, an override may set only some metrics).
    """

    gated_kinds: tuple[str, ...]
    min_slice_frames: int
    budgets: Mapping[str, float]
    slice_overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.budgets) - set(METRIC_COLUMNS))
        for overrides in self.slice_overrides.values():
            unknown += sorted(set(overrides) - set(METRIC_COLUMNS))
        if unknown:
            raise ValueError(f"unknown pruning budget metric(s) {unknown}; known: {METRIC_COLUMNS}")
        if not self.gated_kinds:
            raise ValueError("pruning gates no row: gated_kinds is empty")
        if self.min_slice_frames < 1:
            raise ValueError(f"min_slice_frames must be >= 1, got {self.min_slice_frames}")

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> PruningBudgets:
        """From ``gates.yaml`` ``deployment.pruning`` (or ``config``, the whole gates mapping)."""
        section = settings_section(GATES_FILE, "deployment.pruning", config)
        overrides = section.section("slice_overrides", {})
        return cls(
            gated_kinds=tuple(str(kind) for kind in section.list("gated_kinds")),
            min_slice_frames=section.int("min_slice_frames"),
            budgets={
                str(metric): float(value)
                for metric, value in section.section("budgets").values.items()
            },
            slice_overrides={
                str(pattern): {str(m): float(v) for m, v in (values or {}).items()}
                for pattern, values in overrides.values.items()
            },
        )

    def budget(self, row: str, metric: str) -> float | None:
        """The budget of ``metric`` on row ``row`` (None: that metric is not gated)."""
        return budget_for(
            row, metric, {"budgets": self.budgets, "slice_overrides": self.slice_overrides}
        )


# -- the network's prunable channel groups ----------------------------------------------------


def _check_prunable(net: PerceptionNet) -> None:
    if not isinstance(net, PerceptionNet):
        raise TypeError(f"expected a PerceptionNet, got {type(net).__name__}")
    for index, block in enumerate(net.features):
        conv, bn = block[0], block[1]
        if not isinstance(conv, nn.Conv2d) or not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"features.{index} is not Conv2d + BatchNorm2d: cannot prune it")
        if conv.groups != 1:
            raise TypeError(f"features.{index}: grouped convolutions are not supported")


def _trunk_linear_index(net: PerceptionNet) -> int:
    """Position in ``net.trunk`` of the Linear that reads the flattened last feature map."""
    for index, module in enumerate(net.trunk):
        if isinstance(module, nn.Linear):
            return index
    raise TypeError("the trunk has no Linear layer reading the last feature map")


def _producer(net: PerceptionNet, group: str) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    """The convolution that makes a group's channels and the BatchNorm that scales them."""
    if group == GRID_GROUP:
        head = net.grid_head
        assert head is not None
        return head.detect_features, head.detect[0]
    index = int(group.rsplit(".", 1)[1])
    return net.features[index][0], net.features[index][1]


def prunable_groups(net: PerceptionNet, include_grid_head: bool = True) -> list[str]:
    """Names of the channel groups pruning may shrink: ``features.<i>`` and the grid head's.

    Every group is one convolution's output channels; removing one removes its filter, its
    BatchNorm entry and the matching input slice of every layer that reads it.
    """
    _check_prunable(net)
    groups = [f"features.{index}" for index in range(len(net.features))]
    if include_grid_head and net.grid_head is not None:
        groups.append(GRID_GROUP)
    return groups


def channel_counts(net: PerceptionNet) -> dict[str, int]:
    """Output channels of every prunable group (grid head included when present)."""
    return {group: _producer(net, group)[0].out_channels for group in prunable_groups(net)}


def channel_importance(net: PerceptionNet, group: str, criterion: str) -> torch.Tensor:
    """One score per output channel of ``group``; the lowest are removed first.

    ``l1_bn`` (default): the filter's L1 norm times the |scale| its BatchNorm gives it, the
    size of what the channel passes on (a large filter scaled to nothing contributes nothing);
    ``l1``: the filter's L1 norm; ``bn_scale``: |BatchNorm scale| (network slimming).
    """
    conv, bn = _producer(net, group)
    with torch.no_grad():
        l1 = conv.weight.detach().abs().sum(dim=(1, 2, 3))
        scale = bn.weight.detach().abs() if bn.affine else torch.ones_like(l1)
    if criterion == "l1_bn":
        return l1 * scale
    if criterion == "l1":
        return l1
    if criterion == "bn_scale":
        return scale
    raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")


# -- surgery: smaller modules with the kept slices of the weights -----------------------------


def _conv(
    conv: nn.Conv2d, keep_out: torch.Tensor | None, keep_in: torch.Tensor | None
) -> nn.Conv2d:
    weight = conv.weight.detach()
    bias = None if conv.bias is None else conv.bias.detach()
    if keep_out is not None:
        weight = weight[keep_out]
        bias = None if bias is None else bias[keep_out]
    if keep_in is not None:
        weight = weight[:, keep_in]
    smaller = nn.Conv2d(
        weight.shape[1],
        weight.shape[0],
        kernel_size=conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        bias=bias is not None,
        padding_mode=conv.padding_mode,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        smaller.weight.copy_(weight)
        if bias is not None:
            smaller.bias.copy_(bias)
    return smaller.train(conv.training)


def _batch_norm(bn: nn.BatchNorm2d, keep: torch.Tensor) -> nn.BatchNorm2d:
    smaller = nn.BatchNorm2d(
        len(keep),
        eps=bn.eps,
        momentum=bn.momentum,
        affine=bn.affine,
        track_running_stats=bn.track_running_stats,
    )
    reference = bn.weight if bn.affine else bn.running_mean
    smaller = smaller.to(device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        if bn.affine:
            smaller.weight.copy_(bn.weight.detach()[keep])
            smaller.bias.copy_(bn.bias.detach()[keep])
        if bn.track_running_stats:
            smaller.running_mean.copy_(bn.running_mean[keep])
            smaller.running_var.copy_(bn.running_var[keep])
            smaller.num_batches_tracked.copy_(bn.num_batches_tracked)
    return smaller.train(bn.training)


def _linear_in_blocks(linear: nn.Linear, keep: torch.Tensor, channels: int) -> nn.Linear:
    """``linear`` reading a flattened C x rows x columns map with only channels ``keep`` left.

    Flatten lays a channel's cells out contiguously, so channel ``c`` owns the column block
    ``[c * cells, (c + 1) * cells)`` of the weight; the kept blocks keep their order.
    """
    if linear.in_features % channels:
        raise ValueError(
            f"trunk Linear has {linear.in_features} inputs, not a multiple of {channels} channels"
        )
    cells = linear.in_features // channels
    columns = (keep.reshape(-1, 1) * cells + torch.arange(cells, device=keep.device)).reshape(-1)
    weight = linear.weight.detach()[:, columns]
    smaller = nn.Linear(weight.shape[1], linear.out_features, bias=linear.bias is not None)
    smaller = smaller.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        smaller.weight.copy_(weight)
        if linear.bias is not None:
            smaller.bias.copy_(linear.bias.detach())
    return smaller.train(linear.training)


def remove_channels(net: PerceptionNet, group: str, keep: Sequence[int] | torch.Tensor) -> None:
    """Keep only output channels ``keep`` of ``group`` in ``net`` (in place), and every input
    slice that reads them: the next stage's convolution, the grid head's detector convolution
    (the stage before the last feeds it), the trunk's first Linear (the last stage: its column
    blocks) and, for the grid head's own group, its position map and its 1x1 lane detector.
    """
    conv, bn = _producer(net, group)
    keep = torch.as_tensor(keep, dtype=torch.long, device=conv.weight.device).sort().values
    if len(keep) < 1 or len(torch.unique(keep)) != len(keep):
        raise ValueError(f"{group}: keep needs distinct channel indices, got {keep.tolist()}")
    if int(keep.min()) < 0 or int(keep.max()) >= conv.out_channels:
        raise ValueError(f"{group}: channel index out of range 0..{conv.out_channels - 1}")
    if group == GRID_GROUP:
        head = net.grid_head
        assert head is not None
        head.detect_features = _conv(conv, keep, None)
        head.where = nn.Parameter(head.where.detach()[:, keep].clone())
        head.detect[0] = _batch_norm(bn, keep)
        head.detect[2] = _conv(head.detect[2], None, keep)
        return
    index = int(group.rsplit(".", 1)[1])
    channels = conv.out_channels
    block = net.features[index]
    block[0] = _conv(conv, keep, None)
    block[1] = _batch_norm(bn, keep)
    last = len(net.features) - 1
    if index < last:
        following = net.features[index + 1]
        following[0] = _conv(following[0], None, keep)
    else:
        position = _trunk_linear_index(net)
        net.trunk[position] = _linear_in_blocks(net.trunk[position], keep, channels)
    if net.grid_head is not None and index == last - 1:
        net.grid_head.detect_features = _conv(net.grid_head.detect_features, None, keep)


def prune_channels(
    net: PerceptionNet,
    fraction: float,
    *,
    criterion: str = "l1_bn",
    min_channels: int = 1,
    reference: Mapping[str, int] | None = None,
    include_grid_head: bool = True,
) -> dict[str, int]:
    """Remove the least important ``fraction`` of every group's channels from ``net`` in place.

    ``fraction`` is of ``reference[group]`` channels (default: the group's current count), so a
    schedule of equal steps against the unpruned counts removes equal amounts each step; at
    least one channel per step, never below ``min_channels``. Returns the channels kept.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"pruning fraction must be in (0, 1), got {fraction}")
    if min_channels < 1:
        raise ValueError(f"min_channels must be >= 1, got {min_channels}")
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    kept: dict[str, int] = {}
    for group in prunable_groups(net, include_grid_head):
        current = _producer(net, group)[0].out_channels
        base = current if reference is None else int(reference.get(group, current))
        target = max(min_channels, current - max(1, round(fraction * base)))
        if target < current:
            scores = channel_importance(net, group, criterion)
            # Stable ranking: equal scores keep the lower index, so pruning is deterministic.
            order = torch.argsort(-scores, stable=True)
            remove_channels(net, group, order[:target])
        kept[group] = _producer(net, group)[0].out_channels
    return kept


# -- size: deployment.model_cost (count_parameters, count_macs) ---------------------------------


# -- fine-tuning with the project's recipe ----------------------------------------------------


def fine_tune(
    net: PerceptionNet,
    train_frames: pd.DataFrame,
    training_config: Mapping[str, Any],
    *,
    epochs: int,
    lr_scale: float,
    seed: int,
) -> PerceptionNet:
    """``net`` trained ``epochs`` more epochs (in place) with ``training.yaml``'s recipe.

    The loss, augmentation, optimizer and schedule are ``PerceptionModule``'s; the module is
    built from the configuration and its network swapped for ``net`` (whatever its width).
    ``scratch_trainer`` runs the fit: the recipe's accelerator and precision, no checkpoints,
    no validation. The learning rate is ``optimizer.lr x lr_scale``.
    """
    if epochs < 1:
        return net
    import lightning as L

    from aiinfra_pipelines.training.datamodule import PerceptionDataModule
    from aiinfra_pipelines.training.module import PerceptionModule
    from aiinfra_pipelines.training.trainer import (
        fit,
        preserved_torch_determinism,
        scratch_trainer,
    )

    settings = copy.deepcopy(dict(training_config))
    settings["optimizer"] = {
        **settings["optimizer"],
        "lr": float(settings["optimizer"]["lr"]) * float(lr_scale),
    }
    spec = net.spec
    with preserved_torch_determinism():
        L.seed_everything(seed, workers=True, verbose=False)
        # Validation is off in scratch_trainer; the train table stands in for the val one.
        datamodule = PerceptionDataModule.from_config(
            train_frames, train_frames.head(1), settings, seed=seed, spec=spec
        )
        module = PerceptionModule.from_config(spec, settings, seed)
        # Train mode explicitly: Lightning keeps each submodule's mode as it finds it, and an
        # eval-mode network would fine-tune with frozen BatchNorm statistics (and, with
        # mirror_average, on two views).
        module.net = net.train()
        trainer = scratch_trainer(settings, max_epochs=int(epochs))
        fit(module, datamodule, trainer, None)
    return module.net.eval().cpu()


# -- the guarded schedule ---------------------------------------------------------------------


@dataclass(frozen=True)
class SliceBreach:
    """One gated row of one step beyond its budget (``drop`` > ``budget``, positive = worse)."""

    step: int
    slice: str
    metric: str
    drop: float
    budget: float
    reference: float
    value: float

    def describe(self) -> str:
        return (
            f"step {self.step}: {self.slice} {self.metric} {self.value:.4f} vs unpruned "
            f"{self.reference:.4f} (drop {self.drop:+.4f} > budget {self.budget:.4f})"
        )


@dataclass(frozen=True)
class PruningStep:
    """What one step left and how it scored (step 0: the unpruned network, the reference)."""

    step: int
    channels: Mapping[str, int]
    parameters: int
    macs: int
    overall_accuracy: float
    # gated row -> metric -> drop against the unpruned model (positive = worse)
    drops: Mapping[str, Mapping[str, float]]
    passed: bool
    breaches: tuple[SliceBreach, ...] = ()


@dataclass(frozen=True)
class PruningResult:
    """The pruned network to keep (the last step that held every gated row) and the record.

    ``stopped_by`` is the breach that ended the schedule (the worst one, relative to its
    budget, of the first failing step), ``None`` when every step passed or nothing was left
    to cut. ``steps[0]`` is the unpruned network; ``kept_step`` indexes ``network``'s step.
    """

    network: PerceptionNet
    steps: list[PruningStep]
    kept_step: int
    stopped_by: SliceBreach | None
    reference_metrics: pd.DataFrame
    kept_metrics: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def to_table(self) -> pd.DataFrame:
        """One row per step: size, overall accuracy, the worst drop, verdict (for metadata)."""
        rows = []
        for step in self.steps:
            worst = max(
                (
                    (drop, f"{row} {metric}")
                    for row, metrics in step.drops.items()
                    for metric, drop in metrics.items()
                    if metric == "occupancy_accuracy"
                ),
                default=(float("nan"), ""),
            )
            rows.append(
                {
                    "step": step.step,
                    "channels": sum(step.channels.values()),
                    "parameters": step.parameters,
                    "macs": step.macs,
                    "overall_accuracy": step.overall_accuracy,
                    "worst_accuracy_drop": worst[0],
                    "worst_row": worst[1],
                    "passed": step.passed,
                    "breaches": "; ".join(breach.describe() for breach in step.breaches),
                }
            )
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """JSON-ready facts for asset metadata."""
        reference, kept = self.steps[0], self.steps[self.kept_step]
        return {
            "kept_step": self.kept_step,
            "steps_run": len(self.steps) - 1,
            "parameters": kept.parameters,
            "parameters_ratio": kept.parameters / reference.parameters,
            "macs": kept.macs,
            "macs_ratio": kept.macs / reference.macs,
            "overall_accuracy": kept.overall_accuracy,
            "stopped_by": None
            if self.stopped_by is None
            else f"{self.stopped_by.slice} {self.stopped_by.metric}",
        }


def gated_drops(
    reference: pd.DataFrame,
    candidate: pd.DataFrame,
    budgets: PruningBudgets,
    step: int = 0,
) -> tuple[dict[str, dict[str, float]], list[SliceBreach]]:
    """Drops of every gated row and metric of ``candidate`` against ``reference`` (both
    ``evaluate_by_slice`` tables on the same frames), and the rows beyond their budgets.

    A row is gated when its kind is in ``budgets.gated_kinds`` and the reference measured it on
    at least ``min_slice_frames`` frames; a metric when it has a budget. Each row is judged on
    its own: an average that holds never excuses a condition that does not.
    """
    candidate_rows = candidate.set_index("slice")
    drops: dict[str, dict[str, float]] = {}
    breaches: list[SliceBreach] = []
    for row in reference.itertuples(index=False):
        if row.kind not in budgets.gated_kinds or int(row.frames) < budgets.min_slice_frames:
            continue
        if row.slice not in candidate_rows.index:
            raise ValueError(f"row {row.slice!r} is missing from the pruned network's table")
        for metric in METRIC_COLUMNS:
            budget = budgets.budget(str(row.slice), metric)
            before = float(getattr(row, metric))
            after = float(candidate_rows.at[row.slice, metric])
            if budget is None or math.isnan(before):
                continue
            drop = before - after if HIGHER_IS_BETTER[metric] else after - before
            if math.isnan(drop):  # a metric the pruned net cannot score is a failure
                drop = math.inf
            drops.setdefault(str(row.slice), {})[metric] = drop
            if drop > budget + 1e-12:
                breaches.append(
                    SliceBreach(step, str(row.slice), metric, drop, budget, before, after)
                )
    return drops, breaches


def _check_frames(frames: pd.DataFrame, name: str) -> None:
    if not isinstance(frames, pd.DataFrame):
        raise TypeError(f"{name} must be a frames table (DataFrame), got {type(frames).__name__}")
    if len(frames) == 0:
        raise ValueError(f"{name} is empty: pruning needs frames to fine-tune and judge on")
    if name == "eval_frames" and "slice" not in frames.columns:
        raise ValueError("eval_frames needs a 'slice' column (lighting/weather/road_type)")


def _overall_accuracy(table: pd.DataFrame) -> float:
    rows = table.loc[table["slice"] == OVERALL, "occupancy_accuracy"]
    return float(rows.iloc[0]) if len(rows) else float("nan")


def prune_with_slice_guard(
    net: PerceptionNet,
    train_frames: pd.DataFrame,
    eval_frames: pd.DataFrame,
    settings: PruningSettings | None = None,
    budgets: PruningBudgets | None = None,
    *,
    training_config: Mapping[str, Any] | None = None,
    seed: int | None = None,
    evaluate: Callable[[PerceptionNet, pd.DataFrame], pd.DataFrame] = slice_metrics,
) -> PruningResult:
    """Prune ``net`` step by step, fine-tuning between steps, while every gated row holds.

    Step k removes ``settings.fraction_per_step`` of every group's unpruned channel count
    (lowest ``settings.criterion`` first), fine-tunes ``settings.fine_tune_epochs`` epochs on
    ``train_frames`` (``training_config``: overrides of training.yaml, e.g. data loading), then
    scores ``eval_frames`` per slice (``evaluate``, default ``evaluation.predict.
    slice_metrics``). The first step whose drop against the unpruned network exceeds the budget
    of any gated row (``budgets``, default gates.yaml ``pruning``) ends the schedule; the
    network of the step before is returned, with a record of every step run. ``net`` itself is
    not modified. ``settings``/``budgets`` default to the resources' files.
    """
    _check_prunable(net)
    _check_frames(train_frames, "train_frames")
    _check_frames(eval_frames, "eval_frames")
    settings = PruningSettings.load() if settings is None else settings
    budgets = PruningBudgets.load() if budgets is None else budgets
    config = load_training_config(training_config)
    seed = int(config["seed"] if seed is None else seed)

    current = copy.deepcopy(net).eval().cpu()
    original = channel_counts(current)
    if not settings.prune_grid_head:
        original.pop(GRID_GROUP, None)
    reference_table = evaluate(current, eval_frames)
    steps = [
        PruningStep(
            step=0,
            channels=dict(original),
            parameters=count_parameters(current),
            macs=count_macs(current),
            overall_accuracy=_overall_accuracy(reference_table),
            drops=gated_drops(reference_table, reference_table, budgets)[0],
            passed=True,
        )
    ]
    if not steps[0].drops:
        raise ValueError(
            f"no gated row: eval_frames ({len(eval_frames)} frames) has no row of kinds "
            f"{budgets.gated_kinds} with at least {budgets.min_slice_frames} frames"
        )
    kept, kept_table, stopped_by, notes = current, reference_table, None, []
    for step in range(1, settings.max_steps + 1):
        candidate = copy.deepcopy(kept)
        before = channel_counts(candidate)
        channels = prune_channels(
            candidate,
            settings.fraction_per_step,
            criterion=settings.criterion,
            min_channels=settings.min_channels,
            reference=original,
            include_grid_head=settings.prune_grid_head,
        )
        if all(channels[group] == before[group] for group in channels):
            notes.append(f"step {step}: every group is at min_channels; nothing left to cut")
            break
        candidate = fine_tune(
            candidate,
            train_frames,
            config,
            epochs=settings.fine_tune_epochs,
            lr_scale=settings.lr_scale,
            seed=seed + step,
        )
        table = evaluate(candidate, eval_frames)
        drops, breaches = gated_drops(reference_table, table, budgets, step)
        steps.append(
            PruningStep(
                step=step,
                channels=channel_counts(candidate),
                parameters=count_parameters(candidate),
                macs=count_macs(candidate),
                overall_accuracy=_overall_accuracy(table),
                drops=drops,
                passed=not breaches,
                breaches=tuple(breaches),
            )
        )
        if breaches:
            stopped_by = max(breaches, key=lambda b: (b.drop - b.budget) / max(b.budget, 1e-9))
            notes.append(f"stopped: {stopped_by.describe()}; kept step {step - 1}")
            break
        kept, kept_table = candidate, table
    kept_step = steps[-1].step - (1 if stopped_by is not None else 0)
    return PruningResult(
        network=kept.eval(),
        steps=steps,
        kept_step=kept_step,
        stopped_by=stopped_by,
        reference_metrics=reference_table,
        kept_metrics=kept_table,
        notes=notes,
    )


__all__ = [
    "CRITERIA",
    "PruningBudgets",
    "PruningResult",
    "PruningSettings",
    "PruningStep",
    "SliceBreach",
    "channel_counts",
    "channel_importance",
    "count_macs",
    "count_parameters",
    "fine_tune",
    "gated_drops",
    "prunable_groups",
    "prune_channels",
    "prune_with_slice_guard",
    "remove_channels",
]
