"""Checkpoint tiers: the newest per-epoch checkpoints keep the full training state, older ones
only the weights (``training.yaml`` ``checkpoint``), and a weights-only file is never resumed.

The trained directory is the session's ``uninterrupted`` small run (SMALL_CONFIG: keep 3
per-epoch files, 1 of them full); tests that change files work on a copy. Resume exactness
with tiers live (a SIGKILLed run resumed to bit-identical weights) is asserted in
``test_train.py``'s kill-and-resume test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aiinfra_pipelines.training.checkpoint_tiers import (
    CheckpointRetention,
    apply_tiers,
    demote,
)
from aiinfra_pipelines.training.checkpointing import LAST_CHECKPOINT
from aiinfra_pipelines.training.module import PerceptionModule

from .conftest import SMALL_CONFIG, SMALL_EPOCHS, checkpoint_tiers, train_small

TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def _copy(uninterrupted, target: Path) -> Path:
    return Path(shutil.copytree(uninterrupted.checkpoint_path.parent, target))


def test_newest_checkpoints_keep_the_full_state_older_ones_only_weights(uninterrupted):
    directory = uninterrupted.checkpoint_path.parent

    # 4 epochs, keep 3 per-epoch files, the newest 1 full; epoch 0 was pruned.
    assert checkpoint_tiers(directory) == {
        "epoch=001.ckpt": "weights-only",
        "epoch=002.ckpt": "weights-only",
        "epoch=003.ckpt": "full",
        LAST_CHECKPOINT: "full",
    }
    last, newest = _load(directory / LAST_CHECKPOINT), _load(directory / "epoch=003.ckpt")
    assert all(key in last and key in newest for key in TRAINING_STATE)
    assert last["epoch"] == SMALL_EPOCHS - 1
    network = {f"net.{name}": value for name, value in uninterrupted.network.state_dict().items()}
    _assert_same_tensors({k: v for k, v in last["state_dict"].items() if k in network}, network)
    for epoch in (1, 2):
        slim = _load(directory / f"epoch={epoch:03d}.ckpt")
        assert not any(key in slim for key in TRAINING_STATE), epoch
        assert slim["epoch"] == epoch and slim["global_step"] < last["global_step"]
        assert slim["state_dict"].keys() == last["state_dict"].keys()
        assert slim["hyper_parameters"] == last["hyper_parameters"]
    # AdamW keeps two moments per weight: the weights-only tier is about a third of the bytes.
    full_bytes = (directory / "epoch=003.ckpt").stat().st_size
    slim_bytes = (directory / "epoch=002.ckpt").stat().st_size
    assert slim_bytes < 0.4 * full_bytes, (slim_bytes, full_bytes)
    assert not list(directory.glob(".*.tmp")), "every rewrite went through rename"


def test_demoting_keeps_exactly_the_weights_and_loads_as_a_module(uninterrupted, tmp_path):
    full = uninterrupted.checkpoint_path.parent / "epoch=003.ckpt"
    copy = Path(shutil.copy(full, tmp_path / "epoch=003.ckpt"))

    assert demote(copy) is True
    assert demote(copy) is False  # already weights-only: left as it is

    before, after = _load(full), _load(copy)
    _assert_same_tensors(after["state_dict"], before["state_dict"])
    assert (after["epoch"], after["global_step"]) == (before["epoch"], before["global_step"])
    module = PerceptionModule.load_from_checkpoint(copy, map_location="cpu")
    _assert_same_tensors(
        {f"net.{k}": v for k, v in module.net.state_dict().items()},
        {k: v for k, v in before["state_dict"].items() if k.startswith("net.")},
    )


def test_tiers_are_recomputed_from_the_directory_after_a_kill_between_save_and_demote(
    uninterrupted, tmp_path
):
    """A run killed after a save but before its demotions left every file full: the next
    epoch end (in the resumed process) prunes and demotes from what is on disk."""
    directory = _copy(uninterrupted, tmp_path / "checkpoints")
    for epoch in range(SMALL_EPOCHS):
        shutil.copy(directory / LAST_CHECKPOINT, directory / f"epoch={epoch:03d}.ckpt")

    apply_tiers(directory, CheckpointRetention(every_n_epochs=1, save_top_k=2, full_state_keep=1))

    assert checkpoint_tiers(directory) == {
        "epoch=002.ckpt": "weights-only",
        "epoch=003.ckpt": "full",
        LAST_CHECKPOINT: "full",
    }


def test_resuming_from_a_weights_only_checkpoint_is_refused(uninterrupted, small_split, tmp_path):
    """A weights-only file in the resume point's place would restart AdamW's moments and the
    schedule: refused before any MLflow run is touched, instead of a silently different model."""
    directory = _copy(uninterrupted, tmp_path / "checkpoints")
    shutil.copy(directory / "epoch=002.ckpt", directory / LAST_CHECKPOINT)
    train, val = small_split

    with pytest.raises(ValueError, match=r"weights-only checkpoint .* cannot resume"):
        train_small(train, val, tmp_path, config=SMALL_CONFIG, max_epochs=SMALL_EPOCHS + 1, seed=0)
    assert not (tmp_path / "mlflow.db").exists()
    assert checkpoint_tiers(directory)[LAST_CHECKPOINT] == "weights-only"  # left as it was


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        ({"full_state_keep": -1}, "checkpoint.full_state_keep must be >= 0"),
        ({"save_top_k": -2}, "checkpoint.save_top_k must be >= -1"),
        ({"every_n_epochs": 0}, "checkpoint.every_n_epochs must be >= 1"),
    ],
    ids=["full-state-keep", "save-top-k", "every-n-epochs"],
)
def test_a_bad_retention_fails_before_any_run_or_checkpoint_exists(
    small_split, tmp_path, checkpoint, message
):
    train, val = small_split
    with pytest.raises(ValueError, match=message):
        train_small(train, val, tmp_path, config={**SMALL_CONFIG, "checkpoint": checkpoint})
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "mlflow.db").exists()
