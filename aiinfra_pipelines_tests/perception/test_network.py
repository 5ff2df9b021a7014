"""The perception network's optional grid head: geometry, the lead-gap read-out, ONNX parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiinfra_pipelines.deployment.export import export_checked_onnx
from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec
from aiinfra_pipelines.perception.network import (
    PerceptionNet,
    ahead_column_distances,
    bin_column_ranges,
    expected_first_gap,
    feature_map_size,
)
from aiinfra_pipelines.training.module import PerceptionModule, _grid_geometry
from aiinfra_pipelines.training.settings import load_training_config

SPEC = PerceptionSpec(64, 160, (-10.0, 0.0, 10.0, 20.0, 35.0, 50.0, 75.0), 75.0)


def test_each_distance_bin_maps_to_the_feature_columns_under_it() -> None:
    # ego at 40 px, 1.6 px/m, 8 px per column: 0-10 m is x 40-56 px, columns 5 and 6.
    ranges = bin_column_ranges(SPEC, ego_u_px=40.0, scaling_px_per_m=1.6, stride_px=8)
    assert ranges == ((3, 5), (5, 7), (7, 9), (9, 12), (12, 15), (15, 20))
    first, distances = ahead_column_distances(SPEC, 40.0, 1.6, 8)
    assert first == 5 and len(distances) == 15
    assert distances[0] == pytest.approx(2.5 / 75.0)  # column 5's centre, 44 px
    assert distances[-1] == pytest.approx(72.5 / 75.0)


def test_the_shipped_camera_gives_the_same_geometry_the_head_is_built_with() -> None:
    camera = EgoCamera.load()
    stages = int(load_training_config()["model"]["stages"])
    geometry = _grid_geometry(perception_spec(), "dense+grid", stages)
    # The grid head reads the map one stage before the last: 2 ** (stages - 1) px per column.
    stride = 2 ** (stages - 1)
    expected = bin_column_ranges(
        perception_spec(), camera.ego_u_px, camera.scaling_px_per_m, stride
    )
    assert [tuple(r) for r in geometry["grid_ranges"]] == list(expected)
    assert _grid_geometry(perception_spec(), "dense", stages) == {}
    with pytest.raises(ValueError, match="dense or dense\\+grid"):
        _grid_geometry(perception_spec(), "sparse", stages)


def test_the_lead_gap_is_the_nearest_column_with_a_car_or_the_full_range() -> None:
    distances = torch.tensor([0.1, 0.2, 0.3, 0.4])
    sure, none = 30.0, -30.0
    logits = torch.tensor(
        [
            [none, sure, none, sure],  # first car in column 1 (the one in column 3 is behind it)
            [none, none, none, none],  # nothing ahead: the sensing range
            [0.0, none, none, none],  # a coin flip in column 0: halfway to the range
        ]
    )
    gap = expected_first_gap(logits, distances).squeeze(1)
    assert gap.tolist() == pytest.approx([0.2, 1.0, 0.55], abs=1e-6)


def test_a_grid_network_trains_a_step_and_exports_to_onnx_with_parity() -> None:
    config = load_training_config({"model": {"head": "dense+grid"}})
    module = PerceptionModule.from_config(perception_spec(), config, seed=0)
    network = module.net
    assert network.grid_head is not None
    spec = perception_spec()
    images = torch.rand(4, 3, spec.image_height, spec.image_width)
    occupancy, gap = network(images)
    assert occupancy.shape == (4, 3, spec.bins) and gap.shape == (4, 1)
    assert torch.all((gap >= 0.0) & (gap <= 1.0))
    (occupancy.mean() + gap.mean()).backward()
    assert network.grid_head.detect[0].weight.grad is not None
    network.eval()
    exported = export_checked_onnx(
        network,
        np.random.default_rng(0).random((4, 3, spec.image_height, spec.image_width), np.float32),
        tolerance=1e-4,
        opset=17,
    )
    assert exported.max_abs_error["lead_gap"] <= 1e-4
    assert isinstance(PerceptionNet(spec).grid_head, type(None))


def test_a_sharper_camera_with_a_patch_stem_keeps_the_cells_the_same_size_in_metres() -> None:
    """320x128 at twice the pixels per metre, five stages, the first two a 4 x 4 patch stem:
    the trunk and the grid head see the 64x160 camera's 4 x 10 and 8 x 20 maps, so one
    recipe serves both cameras; the network trains a step and exports with parity."""
    sharp = PerceptionSpec(128, 320, SPEC.bin_edges_m, SPEC.max_range_m)
    assert feature_map_size(sharp, 5) == feature_map_size(SPEC, 4) == (4, 10)
    ranges = bin_column_ranges(sharp, ego_u_px=80.0, scaling_px_per_m=3.2, stride_px=16)
    assert ranges == bin_column_ranges(SPEC, ego_u_px=40.0, scaling_px_per_m=1.6, stride_px=8)
    ahead = ahead_column_distances(sharp, 80.0, 3.2, 16)
    network = PerceptionNet(
        sharp,
        width=16,
        hidden=64,
        pool=None,
        grid_ranges=ranges,
        grid_ahead=ahead,
        stages=5,
        stem_stride=4,
    )
    stem = network.features[0][0]
    assert (stem.kernel_size, stem.stride) == ((4, 4), (4, 4))
    assert len(network.features) == 4  # the stem stands for two of the five stages
    images = torch.rand(2, 3, 128, 320)
    occupancy, gap = network(images)
    assert occupancy.shape == (2, 3, sharp.bins) and gap.shape == (2, 1)
    (occupancy.mean() + gap.mean()).backward()
    assert stem.weight.grad is not None and float(stem.weight.grad.abs().sum()) > 0
    network.eval()
    exported = export_checked_onnx(
        network,
        np.random.default_rng(1).random((2, 3, 128, 320), np.float32),
        tolerance=1e-4,
        opset=17,
    )
    assert exported.max_abs_error["occupancy_logits"] <= 1e-4
    with pytest.raises(ValueError, match="divisible by 4"):
        PerceptionNet(PerceptionSpec(66, 160, SPEC.bin_edges_m, 75.0), stem_stride=4)
    with pytest.raises(ValueError, match="stem_stride"):
        PerceptionNet(SPEC, stem_stride=3)


def test_mirror_average_reads_the_frame_and_its_mirror_image_only_at_inference() -> None:
    """Eval mode: the mean of the frame's reading and its mirror image's, lanes swapped back
    (a mirrored scene reads the same); training mode: one view. Exports with parity."""
    torch.manual_seed(0)
    single = PerceptionNet(SPEC, width=8, hidden=16, pool=None)
    averaged = PerceptionNet(SPEC, width=8, hidden=16, pool=None, mirror_average=True)
    averaged.load_state_dict(single.state_dict())
    single.eval()
    averaged.eval()
    images = torch.rand(3, 3, SPEC.image_height, SPEC.image_width)
    with torch.no_grad():
        occupancy, gap = single(images)
        mirrored_occupancy, mirrored_gap = single(images.flip(-2))
        both_occupancy, both_gap = averaged(images)
        torch.testing.assert_close(both_occupancy, (occupancy + mirrored_occupancy.flip(-2)) / 2)
        torch.testing.assert_close(both_gap, (gap + mirrored_gap) / 2)
        # A mirrored frame reads as the frame with left and right swapped.
        flipped_occupancy, flipped_gap = averaged(images.flip(-2))
        torch.testing.assert_close(flipped_occupancy, both_occupancy.flip(-2))
        torch.testing.assert_close(flipped_gap, both_gap)
    averaged.train()
    single.train()
    torch.manual_seed(1)
    train_occupancy, _ = averaged(images)
    torch.manual_seed(1)
    torch.testing.assert_close(train_occupancy, single(images)[0])
    averaged.eval()
    exported = export_checked_onnx(
        averaged,
        np.random.default_rng(2).random((2, 3, SPEC.image_height, SPEC.image_width), np.float32),
        tolerance=1e-4,
        opset=17,
    )
    assert exported.max_abs_error["occupancy_logits"] <= 1e-4
