"""Shared data for the training tests: real fleet frames, split by log, and small configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

# Small runs (determinism, resume, warm start): in-process loading keeps them quick; the
# real-learning run uses the configured DataLoader workers. They train the dense head: on a
# few hundred frames and 4 epochs the grid head's detectors are still warming up (its val loss
# after 4 epochs is above a dense model's after 1), which would test the head, not the
# mechanics. The grid head's own training step and export: perception/test_network.py.
SMALL_CONFIG: dict = {"data": {"num_workers": 0}, "model": {"head": "dense"}}
SMALL_EPOCHS = 4


def split_by_log(frames: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train/val split with no log in both; one val log per slice that has several logs.

    Stratifying by slice lets the val set report an accuracy for most slices; whole logs go
    to one side because consecutive frames of a log are near-duplicates.
    """
    rng = np.random.default_rng(seed)
    val_logs: list[str] = []
    for _, group in frames.groupby("slice", sort=True):
        logs = sorted(group["log_id"].unique())
        if len(logs) >= 2:
            val_logs.append(logs[int(rng.integers(len(logs)))])
    in_val = frames["log_id"].isin(val_logs)
    return frames[~in_val].reset_index(drop=True), frames[in_val].reset_index(drop=True)


@pytest.fixture(scope="session")
def fleet() -> pd.DataFrame:
    """Frames of 4 vehicles x 4 episodes of highway-env (all road types, weathers, lightings)."""
    return fleet_frames(4, 4, 0)


@pytest.fixture(scope="session")
def fleet_split(fleet: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    return split_by_log(fleet)


@pytest.fixture(scope="session")
def small_split(fleet: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A few logs only: enough to train a couple of epochs in seconds."""
    logs = sorted(fleet["log_id"].unique())
    train = fleet[fleet["log_id"].isin(logs[2:8])].reset_index(drop=True)
    val = fleet[fleet["log_id"].isin(logs[:2])].reset_index(drop=True)
    return train, val


def tracking_uri(directory: Path) -> str:
    return f"sqlite:///{directory / 'mlflow.db'}"
