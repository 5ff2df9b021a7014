"""The recipe's loss weighting and network options, as training.yaml configures them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet, feature_map_size
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.objective import occupancy_cell_weights, perception_loss
from aiinfra_pipelines.training.settings import load_training_config

EDGES = (-10.0, 0.0, 10.0, 20.0, 35.0, 50.0, 75.0)


def test_cell_weights_favour_the_ego_lane_and_near_bins_at_mean_one() -> None:
    weights = occupancy_cell_weights(
        EDGES, near_range_m=20.0, near_bin_weight=2.0, ego_lane_weight=3.0
    )
    assert weights.shape == (3, 6)
    assert float(weights.mean()) == pytest.approx(1.0)
    # Bins starting before 20 m: [-10, 0), [0, 10), [10, 20).
    near_ego, far_ego, near_side, far_side = (
        float(weights[1, 0]),
        float(weights[1, 5]),
        float(weights[0, 2]),
        float(weights[2, 3]),
    )
    assert near_ego / far_ego == pytest.approx(2.0)
    assert near_ego / near_side == pytest.approx(3.0)
    assert near_side / far_side == pytest.approx(2.0)
    assert torch.equal(weights[0], weights[2])
    flat = occupancy_cell_weights(
        EDGES, near_range_m=20.0, near_bin_weight=1.0, ego_lane_weight=1.0
    )
    assert torch.allclose(flat, torch.ones(3, 6))
    with pytest.raises(ValueError, match="> 0"):
        occupancy_cell_weights(EDGES, near_range_m=20.0, near_bin_weight=0.0, ego_lane_weight=1.0)


def test_weighted_loss_reduces_to_plain_bce_and_pos_weight_punishes_missed_cars() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 3, 6, generator=generator)
    target = (torch.rand(8, 3, 6, generator=generator) > 0.7).float()
    gap_pred, gap = torch.rand(8, 1, generator=generator), torch.rand(8, 1, generator=generator)
    kwargs = {"lead_gap_weight": 1.0, "smooth_l1_beta": 0.05}

    _, plain, _ = perception_loss(logits, gap_pred, target, gap, **kwargs)
    _, ones, _ = perception_loss(
        logits, gap_pred, target, gap, cell_weights=torch.ones(3, 6), pos_weight=1.0, **kwargs
    )
    assert float(plain) == pytest.approx(float(F.binary_cross_entropy_with_logits(logits, target)))
    assert float(ones) == pytest.approx(float(plain))

    # A network that calls every cell free: pos_weight scales exactly the missed-car terms.
    free = torch.full_like(logits, -4.0)
    _, base, _ = perception_loss(free, gap_pred, target, gap, **kwargs)
    _, weighted, _ = perception_loss(free, gap_pred, target, gap, pos_weight=3.0, **kwargs)
    positives = F.binary_cross_entropy_with_logits(free, target, reduction="none") * target
    assert float(weighted - base) == pytest.approx(2.0 * float(positives.mean()), rel=1e-5)


def test_unpooled_network_keeps_the_whole_feature_map_and_the_contract_shapes() -> None:
    spec = perception_spec()
    model = load_training_config()["model"]
    stages, stem = int(model["stages"]), int(model["stem_stride"])
    rows, columns = feature_map_size(spec, stages)
    assert (rows, columns) == (4, 10)  # the camera downsampled 2**stages times
    net = PerceptionNet(spec, width=16, hidden=32, pool=None, stages=stages, stem_stride=stem)
    net = net.eval()
    assert net.trunk[1].in_features == 32 * rows * columns
    occupancy, gap = net(torch.rand(2, 3, spec.image_height, spec.image_width))
    assert occupancy.shape == (2, 3, spec.bins) and gap.shape == (2, 1)
    assert bool(((gap >= 0) & (gap <= 1)).all())


def test_module_builds_the_configured_network_and_loss_weights() -> None:
    spec = perception_spec()
    config = load_training_config(
        {
            "model": {"width": 16, "hidden": 32, "pool": None},
            "loss": {
                "pos_weight": 2.0,
                "near_range_m": 20.0,
                "near_bin_weight": 2.0,
                "ego_lane_weight": 1.5,
            },
        }
    )
    module = PerceptionModule.from_config(spec, config, seed=0)
    assert isinstance(module.net.pool, torch.nn.Identity)
    assert module.hparams.pos_weight == 2.0
    expected = occupancy_cell_weights(
        spec.bin_edges_m, near_range_m=20.0, near_bin_weight=2.0, ego_lane_weight=1.5
    )
    assert torch.allclose(module.cell_weights, expected)
    # Derived, not persisted: a checkpoint's state dict holds only the network.
    assert "cell_weights" not in module.state_dict()
