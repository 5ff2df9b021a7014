"""Shared data for the training tests: real fleet frames, split by log, and small configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from aiinfra_pipelines.training.checkpointing import is_full_state
from aiinfra_pipelines.training.train import TrainingResult, train_perception_model
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames, hold_out_one_log_per_slice

# Small runs (determinism, resume, warm start): in-process loading keeps them quick; the
# real-learning run uses the configured DataLoader workers. They train the dense head: on a
# few hundred frames and 4 epochs the grid head's detectors are still warming up (its val loss
# after 4 epochs is above a dense model's after 1), which would test the head, not the
# mechanics. The grid head's own training step and export: perception/test_network.py.
# Their checkpoints are tiered (training.checkpoint_tiers) so that every small run, the killed
# and resumed one included, prunes and demotes files: after 4 epochs epoch=003 keeps the full
# state, epoch=002 and epoch=001 only weights, epoch=000 is gone; last.ckpt is always full.
SMALL_CONFIG: dict = {
    "data": {"num_workers": 0},
    "model": {"head": "dense"},
    "checkpoint": {"save_top_k": 3, "full_state_keep": 1},
}
SMALL_EPOCHS = 4

EXPERIMENT = "perception-test"
TAGS = {"dagster_run_id": "dagster-run-123", "asset": "trained_model"}
PARAMS = {"dataset_commit_id": "c0ffee1234", "code_version": "test-code-1"}


@pytest.fixture(scope="session")
def fleet() -> pd.DataFrame:
    """Frames of 4 vehicles x 4 episodes of highway-env (all road types, weathers, lightings)."""
    return fleet_frames(4, 4, 0)


@pytest.fixture(scope="session")
def fleet_split(fleet: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    return hold_out_one_log_per_slice(fleet)


@pytest.fixture(scope="session")
def small_split(fleet: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A few logs only: enough to train a couple of epochs in seconds."""
    logs = sorted(fleet["log_id"].unique())
    train = fleet[fleet["log_id"].isin(logs[2:8])].reset_index(drop=True)
    val = fleet[fleet["log_id"].isin(logs[:2])].reset_index(drop=True)
    return train, val


def tracking_uri(directory: Path) -> str:
    return f"sqlite:///{directory / 'mlflow.db'}"


def train_small(
    train: pd.DataFrame, val: pd.DataFrame, root: Path, **overrides: Any
) -> TrainingResult:
    """``train_perception_model`` into ``root`` (checkpoints + sqlite MLflow store)."""
    kwargs = {
        "checkpoint_dir": root / "checkpoints",
        "mlflow_tracking_uri": tracking_uri(root),
        "experiment": EXPERIMENT,
        "run_tags": TAGS,
        "params": PARAMS,
        **overrides,
    }
    return train_perception_model(train, val, **kwargs)


def checkpoint_tiers(directory: Path) -> dict[str, str]:
    """``{file name: "full" | "weights-only"}`` for every checkpoint in ``directory``."""
    tiers = {}
    for path in sorted(directory.glob("*.ckpt")):
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        tiers[path.name] = "full" if is_full_state(checkpoint) else "weights-only"
    return tiers


@pytest.fixture(scope="session")
def uninterrupted(small_split, tmp_path_factory) -> TrainingResult:
    """The reference small run: SMALL_EPOCHS epochs, seed 0, never interrupted.

    Read-only for its users (the resume, determinism, warm-start and checkpoint-tier tests):
    a test that changes its checkpoint directory works on a copy.
    """
    train, val = small_split
    root = tmp_path_factory.mktemp("uninterrupted")
    return train_small(train, val, root, config=SMALL_CONFIG, max_epochs=SMALL_EPOCHS, seed=0)
