"""Small, really trained networks and labelled fleet frames for the deployment tests.

Quantization questions (which layer is sensitive, does INT8 keep the night slice) only mean
something on a network that learned from real frames: an untrained one outputs noise that any
precision reproduces equally badly. A few epochs of plain PyTorch on highway-env frames give
one in seconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from aiinfra_pipelines.deployment.frames import LabelledFrames, labelled_frames
from aiinfra_pipelines.perception.contract import images_to_input, perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.training.objective import perception_loss


def split_logs(frames: pd.DataFrame, every: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, held out): every ``every``-th log held out, so held-out frames are unseen drives."""
    logs = sorted(frames["log_id"].unique())
    held = set(logs[::every])
    mask = frames["log_id"].isin(held)
    return frames[~mask].reset_index(drop=True), frames[mask].reset_index(drop=True)


def train_network(
    frames: LabelledFrames, epochs: int = 4, seed: int = 0, batch_size: int = 32
) -> PerceptionNet:
    """``PerceptionNet`` fitted with AdamW on ``frames`` (the training loss of the project)."""
    torch.manual_seed(seed)
    return fit_network(PerceptionNet(perception_spec()), frames, epochs, seed, batch_size)


def fit_network(
    network: PerceptionNet,
    frames: LabelledFrames,
    epochs: int,
    seed: int,
    batch_size: int = 32,
    *,
    lr: float = 3e-3,
    weight_decay: float = 0.05,
    lead_gap_weight: float = 1.0,
    smooth_l1_beta: float = 0.05,
) -> PerceptionNet:
    """``network`` fitted in place with plain AdamW and the project's loss (no augmentation, no
    Lightning): a network whose quantization questions mean something, in seconds to minutes."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=weight_decay)
    images = torch.from_numpy(images_to_input(frames.images))
    occupancy = torch.from_numpy(frames.occupancy_target)
    lead_gap = torch.from_numpy(frames.lead_gap_target).reshape(-1, 1)
    generator = torch.Generator().manual_seed(seed)
    network.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(images), generator=generator).split(batch_size):
            logits, gap = network(images[batch])
            loss, _, _ = perception_loss(
                logits,
                gap,
                occupancy[batch],
                lead_gap[batch],
                lead_gap_weight=lead_gap_weight,
                smooth_l1_beta=smooth_l1_beta,
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return network.eval()


def fleet_labelled(n_vehicles: int = 4, episodes: int = 2, seed: int = 0) -> pd.DataFrame:
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    return fleet_frames(n_vehicles, episodes, seed)


def labelled(frames: pd.DataFrame) -> LabelledFrames:
    return labelled_frames(frames)


def sample(frames: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` frames drawn without replacement, in a seeded order (deterministic)."""
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(len(frames), size=min(n, len(frames)), replace=False))
    return frames.iloc[picked].reset_index(drop=True)
