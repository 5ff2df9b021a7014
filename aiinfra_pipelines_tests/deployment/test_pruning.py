"""Structured pruning (deployment.pruning): real surgery, real export, a real per-slice guard.

The surgery tests use the configured architecture (stride-4 stem, five stages, grid head) so
every consumer of a pruned channel is exercised: the next stage, the grid head's detector
convolution and position map, and the trunk Linear's column blocks. The guard test measures
a real schedule (pruned, fine-tuned with the training recipe, scored by ``slice_metrics``) and
then gates the same schedule with one budget for every row, set between what the rows lost
before the step and what one condition lost at it while the average held.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import torch

from aiinfra_pipelines.config import SettingsError, load_resource_yaml
from aiinfra_pipelines.deployment.pruning import (
    GRID_GROUP,
    PruningBudgets,
    PruningSettings,
    channel_counts,
    channel_importance,
    count_macs,
    count_parameters,
    gated_drops,
    prunable_groups,
    prune_channels,
    prune_with_slice_guard,
)
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.perception.contract import (
    EMBEDDING_OUTPUT,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    decode_images,
    images_to_input,
    perception_spec,
)
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.perception.onnx_export import export_onnx
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames, hold_out_one_log_per_slice
from aiinfra_pipelines_tests.support.trained_networks import fit_network, labelled

GATED = ("lighting", "weather", "road_type", "overall")


def pruning_yaml() -> dict:
    """A fresh copy of deployment.yaml ``pruning`` (tests edit it)."""
    return dict(load_resource_yaml("deployment.yaml")["pruning"])


# The small schedule the guard tests run: two steps of 30 % with one fine-tune epoch each.
SCHEDULE = PruningSettings(
    fraction_per_step=0.3,
    max_steps=2,
    fine_tune_epochs=1,
    lr_scale=0.3,
    criterion="l1_bn",
    min_channels=4,
)
TRAINING = {"data": {"num_workers": 0}, "model": {"head": "dense"}}


def configured_net(seed: int = 0) -> PerceptionNet:
    """The network training.yaml builds, grid head forced on, with non-trivial BN statistics."""
    torch.manual_seed(seed)
    config = load_training_config({"model": {"head": "dense+grid"}})
    net = PerceptionModule.from_config(perception_spec(), config, seed).net
    with torch.no_grad():
        for group in prunable_groups(net):
            bn = _bn(net, group)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.1, 0.1)
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 2.0)
        net.grid_head.where.normal_(0.0, 0.5)
    return net.eval()


def _bn(net: PerceptionNet, group: str) -> torch.nn.BatchNorm2d:
    if group == GRID_GROUP:
        return net.grid_head.detect[0]
    return net.features[int(group.rsplit(".", 1)[1])][1]


def _images(frames: pd.DataFrame, n: int) -> torch.Tensor:
    spec = perception_spec()
    images = decode_images(list(frames["image"].iloc[:n]), spec.image_height, spec.image_width)
    return torch.from_numpy(images_to_input(images))


@pytest.fixture(scope="module")
def fleet_split() -> tuple[pd.DataFrame, pd.DataFrame]:
    """4 vehicles x 4 episodes split by log, one held-out log per slice (as training tests)."""
    return hold_out_one_log_per_slice(fleet_frames(4, 4, 0))


@pytest.fixture(scope="module")
def trained(fleet_split) -> PerceptionNet:
    """The configured network with the dense head, really trained on the train split.

    Plain AdamW without augmentation (support.trained_networks.fit_network), 5 epochs: in
    half a minute it learns well past the constant guess, so cutting channels costs accuracy
    (the recipe's few augmented epochs leave it near the guess, where any fine-tune helps).
    The grid head learns too slowly for a test; its surgery and export are tested untrained.
    """
    train, _ = fleet_split
    torch.manual_seed(0)
    config = load_training_config(TRAINING)
    net = PerceptionModule.from_config(perception_spec(), config, 0).net
    return fit_network(net, labelled(train), epochs=5, seed=0)


# -- surgery ------------------------------------------------------------------------------


def test_removing_dead_channels_changes_no_output_and_shrinks_the_net() -> None:
    """Channels whose BatchNorm zeroes them (scale 0, shift 0) carry nothing: removing them,
    with every consumer's matching input slice, must leave all three outputs unchanged. Any
    wrong index mapping (the next stage, the grid head's input or position map, the trunk's
    column blocks) changes the outputs."""
    net = configured_net()
    fraction = 0.15
    dead: dict[str, int] = {}
    with torch.no_grad():
        for group in prunable_groups(net):
            bn = _bn(net, group)
            dead[group] = round(fraction * bn.num_features)
            # scattered, not the first ones: the kept order and the column blocks matter
            idx = torch.arange(1, bn.num_features, 5)[: dead[group]]
            bn.weight[idx] = 0.0
            bn.bias[idx] = 0.0
    before_channels = channel_counts(net)
    before_params, before_macs = count_parameters(net), count_macs(net)
    trunk_inputs = net.trunk[1].in_features
    image = torch.rand(4, 3, net.spec.image_height, net.spec.image_width)
    with torch.no_grad():
        expected = net(image)
        expected_embedding = net.embed(image)

    kept = prune_channels(net, fraction, criterion="l1_bn", min_channels=4)

    assert isinstance(net, PerceptionNet)
    assert kept == {group: count - dead[group] for group, count in before_channels.items()}
    assert channel_counts(net) == kept
    with torch.no_grad():
        actual = net(image)
        actual_embedding = net.embed(image)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual_embedding, expected_embedding, atol=1e-5, rtol=1e-5)
    assert count_parameters(net) < before_params
    assert count_macs(net) < before_macs
    # Physically smaller tensors, not masks: every conv and the trunk's Linear shrank.
    assert net.features[0][0].weight.shape[0] == kept["features.0"]
    assert net.features[1][0].weight.shape[1] == kept["features.0"]
    last = f"features.{len(net.features) - 1}"
    cells = trunk_inputs // before_channels[last]
    assert net.trunk[1].in_features == kept[last] * cells
    assert net.grid_head.detect_features.in_channels == kept[f"features.{len(net.features) - 2}"]
    assert net.grid_head.where.shape[1] == kept[GRID_GROUP]
    assert net.grid_head.detect[2].in_channels == kept[GRID_GROUP]


def test_criterion_removes_the_smallest_filter_times_scale() -> None:
    """l1_bn keeps the channels with the largest |BN scale| x filter L1 norm."""
    net = configured_net(seed=1)
    group = "features.2"
    scores = channel_importance(net, group, "l1_bn")
    bn_before = _bn(net, group).weight.detach().clone()
    keep = int(scores.numel() - round(0.25 * scores.numel()))
    expected = bn_before[torch.sort(torch.argsort(-scores)[:keep]).values]
    prune_channels(net, 0.25, criterion="l1_bn")
    torch.testing.assert_close(_bn(net, group).weight.detach(), expected)
    # bn_scale ranks by the scale alone: a different choice on the same weights.
    other = configured_net(seed=1)
    prune_channels(other, 0.25, criterion="bn_scale")
    kept_by_scale = _bn(other, group).weight.detach()
    assert torch.equal(
        kept_by_scale, bn_before[torch.sort(torch.argsort(-bn_before.abs())[:keep]).values]
    )


def test_pruned_network_exports_to_onnx_and_runs_in_onnxruntime(fleet_split) -> None:
    """Two steps of 30 % of the configured network (grid head included): a narrower graph
    with the contract's outputs, equal to PyTorch on real frames."""
    _, val = fleet_split
    net = configured_net()
    original = channel_counts(net)
    for _ in range(2):
        prune_channels(net, 0.3, criterion="l1_bn", min_channels=4, reference=original)
    assert all(channel_counts(net)[g] < original[g] for g in original)

    payload = export_onnx(net)
    model = onnx.load_from_string(payload)
    weights = {init.name: init for init in model.graph.initializer}
    conv_out = {
        weights[node.input[1]].dims[0]
        for node in model.graph.node
        if node.op_type == "Conv" and node.input[1] in weights
    }
    assert max(conv_out) < max(original.values())  # no full-width convolution left

    session = ort.InferenceSession(payload, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    assert names == [OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT, EMBEDDING_OUTPUT]
    images = _images(val, 8)
    occupancy, lead_gap, embedding = session.run(None, {"image": images.numpy()})
    with torch.no_grad():
        torch_occupancy, torch_gap = net.eval()(images)
    assert occupancy.shape == (8, 3, net.spec.bins)
    assert embedding.shape == (8, net.embedding_dim)
    np.testing.assert_allclose(occupancy, torch_occupancy.numpy(), atol=1e-4)
    np.testing.assert_allclose(lead_gap, torch_gap.numpy(), atol=1e-4)


# -- the gate, as a pure function ---------------------------------------------------------


def _table(accuracy: dict[str, tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "slice": name,
                "kind": kind,
                "frames": frames,
                "occupancy_accuracy": value,
                "occupancy_f1": value,
                "lead_gap_mae_m": 5.0,
            }
            for name, (kind, frames, value) in accuracy.items()
        ]
    )


def test_gated_drops_flags_a_slice_the_average_hides() -> None:
    budgets = PruningBudgets(GATED, 40, {"occupancy_accuracy": 0.01})
    reference = _table(
        {
            "night/clear/highway": ("slice", 30, 0.90),
            "night/*/*": ("lighting", 60, 0.90),
            "day/*/*": ("lighting", 940, 0.90),
            "*/*/merge": ("road_type", 12, 0.90),  # too few frames: reported, not gated
            "overall": ("overall", 1000, 0.90),
        }
    )
    candidate = _table(
        {
            "night/clear/highway": ("slice", 30, 0.50),  # a single slice: not a gated kind
            "night/*/*": ("lighting", 60, 0.85),
            "day/*/*": ("lighting", 940, 0.91),
            "*/*/merge": ("road_type", 12, 0.10),
            "overall": ("overall", 1000, 0.9064),
        }
    )
    drops, breaches = gated_drops(reference, candidate, budgets, step=3)
    assert set(drops) == {"night/*/*", "day/*/*", "overall"}
    assert drops["overall"]["occupancy_accuracy"] < 0  # the average improved
    assert [(b.step, b.slice, b.metric) for b in breaches] == [
        (3, "night/*/*", "occupancy_accuracy")
    ]
    assert math.isclose(breaches[0].drop, 0.05)


# -- the guarded schedule (real fine-tuning, real per-slice evaluation) -------------------


@pytest.fixture(scope="module")
def measured(trained, fleet_split):
    """The schedule with budgets no row can exceed: what every step costs every row."""
    train, val = fleet_split
    unlimited = PruningBudgets(GATED, 40, {"occupancy_accuracy": 1.0})
    return prune_with_slice_guard(
        trained, train, val, SCHEDULE, unlimited, training_config=TRAINING, seed=0
    )


@pytest.mark.slow
def test_each_step_is_smaller_and_recorded(measured, trained) -> None:
    assert measured.stopped_by is None
    assert [step.step for step in measured.steps] == [0, 1, 2]
    assert measured.kept_step == 2
    params = [step.parameters for step in measured.steps]
    macs = [step.macs for step in measured.steps]
    assert params == sorted(params, reverse=True) and len(set(params)) == 3
    assert macs == sorted(macs, reverse=True) and len(set(macs)) == 3
    assert measured.steps[0].parameters == count_parameters(trained)
    assert channel_counts(measured.network) == dict(measured.steps[2].channels)
    assert channel_counts(trained) == dict(measured.steps[0].channels)  # input left alone
    for step in measured.steps:
        assert {"night/*/*", "overall"} <= set(step.drops)
        assert all(math.isfinite(d["occupancy_accuracy"]) for d in step.drops.values())
    table = measured.to_table()
    assert list(table["step"]) == [0, 1, 2] and table["passed"].all()
    assert measured.summary()["macs_ratio"] < 1.0


@pytest.mark.slow
def test_pruning_stops_on_a_slice_regression_that_the_average_hides(
    measured, trained, fleet_split
) -> None:
    """One budget for every gated row, chosen from the measured schedule: above everything
    every row lost before step k and above what the average lost at step k, below what one
    condition lost at step k. The guard must stop at step k, name that condition, and
    return step k - 1's network."""
    accuracy = "occupancy_accuracy"

    def losses(step):
        return {row: d[accuracy] for row, d in step.drops.items()}

    choice = None
    for k in range(len(measured.steps) - 1, 0, -1):  # prefer a later step: k - 1 is pruned
        earlier = max(max(losses(s).values()) for s in measured.steps[:k])
        at_k = losses(measured.steps[k])
        worst_row = max((r for r in at_k if r != "overall"), key=at_k.get)
        floor = max(earlier, at_k["overall"])
        if at_k[worst_row] > floor + 1e-3:
            choice = (k, worst_row, (floor + at_k[worst_row]) / 2)
            break
    assert choice is not None, (
        "precondition: some step must cost one condition more than the average and than any "
        f"earlier step; measured {[losses(s) for s in measured.steps]}"
    )
    k, row, budget = choice
    train, val = fleet_split
    budgets = PruningBudgets(GATED, 40, {accuracy: budget})

    result = prune_with_slice_guard(
        trained, train, val, SCHEDULE, budgets, training_config=TRAINING, seed=0
    )

    assert result.stopped_by is not None
    assert result.stopped_by.step == k
    assert result.stopped_by.metric == accuracy
    breached = {breach.slice for breach in result.steps[k].breaches}
    assert result.stopped_by.slice in breached and row in breached
    assert "overall" not in breached  # the average held
    assert result.steps[k].drops["overall"][accuracy] <= budget
    assert not result.steps[k].passed and all(s.passed for s in result.steps[:k])
    assert len(result.steps) == k + 1  # nothing pruned past the failing step
    # The returned network is step k - 1's: its channels, and its measured metrics.
    assert result.kept_step == k - 1
    assert channel_counts(result.network) == dict(measured.steps[k - 1].channels)
    assert result.steps[k - 1].overall_accuracy == pytest.approx(
        measured.steps[k - 1].overall_accuracy, abs=1e-9
    )
    rescored = slice_metrics(result.network, val).set_index("slice")[accuracy]
    assert rescored["overall"] == pytest.approx(result.steps[k - 1].overall_accuracy, abs=1e-9)


# -- settings and bad inputs --------------------------------------------------------------


def test_settings_and_budgets_load_from_the_resources() -> None:
    settings = PruningSettings.load()
    assert 0 < settings.fraction_per_step < 1 and settings.max_steps >= 1
    budgets = PruningBudgets.load()
    assert "overall" in budgets.gated_kinds
    assert budgets.budget("night/*/*", "occupancy_accuracy") is not None
    assert budgets.budget("*/fog/*", "occupancy_accuracy") == budgets.budgets["occupancy_accuracy"]


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_fraction_out_of_range_is_refused(fraction) -> None:
    with pytest.raises(ValueError, match="fraction"):
        prune_channels(configured_net(), fraction)
    config = {"pruning": {**pruning_yaml(), "fraction_per_step": fraction}}
    with pytest.raises(ValueError, match="fraction_per_step"):
        PruningSettings.load(config)


def test_unknown_criterion_and_missing_key_are_refused() -> None:
    config = {"pruning": {**pruning_yaml(), "criterion": "random"}}
    with pytest.raises(ValueError, match="criterion"):
        PruningSettings.load(config)
    incomplete = {k: v for k, v in pruning_yaml().items() if k != "max_steps"}
    with pytest.raises(SettingsError, match=r"pruning\.max_steps"):
        PruningSettings.load({"pruning": incomplete})
    with pytest.raises(ValueError, match="unknown pruning budget metric"):
        PruningBudgets(GATED, 40, {"accuracy": 0.01})


def test_no_frames_is_refused_before_any_work(fleet_split) -> None:
    train, val = fleet_split
    net = configured_net()
    with pytest.raises(ValueError, match="train_frames is empty"):
        prune_with_slice_guard(net, train.iloc[:0], val, SCHEDULE)
    with pytest.raises(ValueError, match="eval_frames is empty"):
        prune_with_slice_guard(net, train, val.iloc[:0], SCHEDULE)
    with pytest.raises(ValueError, match="no gated row"):
        prune_with_slice_guard(
            net, train, val.iloc[:10], SCHEDULE, PruningBudgets(GATED, 40, {"occupancy_f1": 0.1})
        )
    with pytest.raises(TypeError, match="PerceptionNet"):
        prune_with_slice_guard(torch.nn.Linear(2, 2), train, val, SCHEDULE)
