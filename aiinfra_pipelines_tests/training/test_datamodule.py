"""Frames → tensors: labels, loaders, reproducible shuffling, and clear errors on bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from aiinfra_pipelines.perception.contract import decode_images, perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels
from aiinfra_pipelines.training.datamodule import (
    EpochSeededShuffle,
    PerceptionDataModule,
    PerceptionDataset,
    ego_lane_balance_weights,
)
from aiinfra_pipelines.training.objective import images_to_float, mirror_lanes, near_bins


@pytest.fixture(scope="module")
def frames(small_split) -> pd.DataFrame:
    return small_split[1]


def test_dataset_holds_decoded_images_and_ground_truth_labels(frames):
    spec = perception_spec()
    dataset = PerceptionDataset(frames, spec)
    occupancy, lead_gap = ground_truth_labels(frames, spec)

    assert len(dataset) == len(frames)
    image, cell_labels, gap = dataset[3]
    assert image.dtype == torch.uint8 and image.shape == (3, spec.image_height, spec.image_width)
    expected = decode_images([frames["image"].iloc[3]], spec.image_height, spec.image_width)[0]
    assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(expected.copy()))
    assert torch.equal(cell_labels, torch.from_numpy(occupancy[3]))
    assert gap.shape == (1,) and float(gap) == pytest.approx(float(lead_gap[3]))
    # Floats for the network are the contract's [0, 1] scaling, in either memory layout.
    as_float = images_to_float(image.unsqueeze(0), channels_last=True)
    assert as_float.max() <= 1.0 and torch.allclose(as_float, image.unsqueeze(0).float() / 255)


def test_shuffle_order_depends_only_on_seed_and_epoch():
    sampler = EpochSeededShuffle(50, seed=7)
    sampler.set_epoch(3)
    first = list(sampler)
    sampler.set_epoch(4)
    other_epoch = list(sampler)
    fresh = EpochSeededShuffle(50, seed=7)  # e.g. a process resumed at epoch 3
    fresh.set_epoch(3)

    assert sorted(first) == list(range(50))
    assert list(fresh) == first
    assert other_epoch != first


def test_loaders_use_workers_persistently_and_pin_only_on_an_accelerator(small_split):
    train, val = small_split
    datamodule = PerceptionDataModule(
        train, val, batch_size=16, num_workers=2, pin_memory=True, seed=0
    )
    loader = datamodule.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers
    assert not loader.pin_memory  # no Trainer on an accelerator attached
    assert isinstance(loader.sampler, EpochSeededShuffle)
    assert len(datamodule.val_dataloader().dataset) == len(val)

    in_process = PerceptionDataModule(
        train, val, batch_size=16, num_workers=0, pin_memory=True, seed=0
    ).train_dataloader()
    assert in_process.num_workers == 0 and not in_process.persistent_workers
    images, occupancy, lead_gap = next(iter(in_process))
    assert images.shape[0] == occupancy.shape[0] == lead_gap.shape[0] == 16


def test_mirroring_swaps_left_and_right_lanes_of_flipped_frames_only():
    images = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    occupancy = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]]).repeat(2, 1, 1)
    flipped, labels = mirror_lanes(images, occupancy, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(flipped, images.flip(-2))
    assert torch.equal(labels[:, 0], occupancy[:, 2]) and torch.equal(labels[:, 2], occupancy[:, 0])
    same, kept = mirror_lanes(images, occupancy, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(same, images) and torch.equal(kept, occupancy)


def _with_nan_vehicle(frames: pd.DataFrame, row: int = 2) -> pd.DataFrame:
    broken = frames.copy()
    vehicles = json.loads(broken.at[row, "ground_truth"]) or [
        {"vehicle_id": 1, "x": 0.0, "y": 0.0, "vx": 0.0, "vy": 0.0, "lane_offset": 0}
    ]
    vehicles[0]["x"] = float("nan")
    broken.at[row, "ground_truth"] = json.dumps(vehicles)  # json writes the NaN token
    return broken


def _resized(frames: pd.DataFrame, row: int = 1) -> pd.DataFrame:
    broken = frames.copy()
    broken.at[row, "image_height"] = 32
    broken.at[row, "image"] = bytes(32 * int(frames.at[row, "image_width"]) * 3)
    return broken


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: f.iloc[0:0], "empty"),
        (_resized, "mismatched image sizes.*128x320.*32x320"),
        (_with_nan_vehicle, "NaN.*ground truth"),
        (
            lambda f: f.assign(
                lane_index=np.where(np.arange(len(f)) == 1, np.nan, f["lane_index"])
            ),
            "NaN lane_index",
        ),
        (lambda f: f.assign(image=[b"\x00" * 10] * len(f)), "image payloads"),
        (lambda f: f.drop(columns=["ground_truth"]), "missing required columns"),
    ],
    ids=["empty", "image-size", "nan-ground-truth", "nan-lane", "truncated-image", "column"],
)
def test_bad_frames_fail_with_a_value_error_naming_the_problem(frames, damage, message):
    with pytest.raises(ValueError, match=message):
        PerceptionDataset(damage(frames.reset_index(drop=True)), perception_spec(), name="val")


def test_ego_lane_balance_draws_rare_close_cars_more_often_per_road_type():
    """10 % of junction frames have a car close in the ego lane; balance lifts their share."""
    occupancy = np.zeros((40, 3, 6), dtype=np.float32)
    occupancy[:2, 1, 2] = 1.0  # junction: 2 of 20 frames with a close car
    occupancy[20:30, 1, 1] = 1.0  # highway: 10 of 20
    occupancy[5, 1, 5] = 1.0  # a far car (bin 5) is not "close"
    roads = np.array(["intersection"] * 20 + ["highway"] * 20)
    # The configured bins and near range: bins 0-3 start before 35 m, bin 5 (50-75 m) does not.
    near = near_bins([-10, 0, 10, 20, 35, 50, 75], 35.0)
    assert near.tolist() == [True, True, True, True, False, False]
    assert ego_lane_balance_weights(occupancy, roads, near=near, strength=0.0) is None

    weights = ego_lane_balance_weights(occupancy, roads, near=near, strength=1.0)
    junction, highway = weights[:20], weights[20:]
    # Every road type keeps its share of the epoch ...
    assert junction.sum() == pytest.approx(20.0) and highway.sum() == pytest.approx(20.0)
    # ... fully balanced: the 2 close-car frames get half of the junction's draws.
    assert junction[:2].sum() == pytest.approx(junction[2:].sum())
    assert weights[5] == pytest.approx(weights[10])  # the far car counts as "no close car"
    assert highway[:10].sum() == pytest.approx(highway[10:].sum())

    tempered = ego_lane_balance_weights(occupancy, roads, near=near, strength=0.5)
    assert 2 / 20 < tempered[:2].sum() / 20 < 0.5


def test_weighted_epochs_are_reproducible_draws_of_the_weighted_frames():
    weights = torch.tensor([0.0, 1.0, 3.0])
    sampler = EpochSeededShuffle(3, seed=4, weights=weights)
    sampler.set_epoch(2)
    first = list(sampler)
    sampler.set_epoch(2)
    assert list(sampler) == first and len(first) == 3
    assert 0 not in first  # a zero weight is never drawn
    with pytest.raises(ValueError, match="2 sampling weights for 3"):
        EpochSeededShuffle(3, seed=4, weights=torch.ones(2))
