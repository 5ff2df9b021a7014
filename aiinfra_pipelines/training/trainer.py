"""The Lightning ``Trainer``, built from ``training.yaml``'s ``trainer`` section, and the fit.

Hardware and loop settings (accelerator, devices, strategy, precision, ...) are data: the same
code runs on a CPU laptop, one GPU or several under DDP, chosen by configuration (and the
environment's overrides), never by code. What is fixed here is what resuming relies on:
durable checkpoints, end-of-epoch saves, and no Lightning logger (MLflow is ours).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from .checkpoint_tiers import checkpoint_callback
from .checkpointing import DurableCheckpointIO
from .datamodule import PerceptionDataModule
from .module import PerceptionModule

_EXPECTED_LIGHTNING_WARNINGS = (
    r"Checkpoint directory .* exists and is not empty",
    r"You have overridden `on_after_batch_transfer` in `LightningModule`",
)


def build_trainer(
    config: dict[str, Any],
    checkpoint_dir: Path,
    max_epochs: int,
    callbacks: list[Callback],
) -> L.Trainer:
    """A ``Trainer`` from ``config["trainer"]`` that checkpoints into ``checkpoint_dir``.

    ``enable_progress_bar: null`` means "when stderr is a terminal", so scheduled runs do not
    fill their logs with progress bars.
    """
    settings = config["trainer"]
    progress_bar = settings.get("enable_progress_bar")
    if progress_bar is None:
        progress_bar = sys.stderr.isatty()
    return L.Trainer(
        accelerator=settings["accelerator"],
        devices=settings["devices"],
        strategy=settings["strategy"],
        num_nodes=int(settings["num_nodes"]),
        precision=settings["precision"],
        deterministic=settings["deterministic"],
        max_epochs=max_epochs,
        callbacks=[*callbacks, checkpoint_callback(checkpoint_dir, config["checkpoint"])],
        plugins=[DurableCheckpointIO()],
        logger=False,
        default_root_dir=checkpoint_dir,
        enable_progress_bar=bool(progress_bar),
        enable_model_summary=bool(settings["enable_model_summary"]),
        num_sanity_val_steps=int(settings["num_sanity_val_steps"]),
        gradient_clip_val=settings.get("gradient_clip_val"),
        log_every_n_steps=int(settings["log_every_n_steps"]),
    )


def scratch_trainer(
    config: dict[str, Any],
    *,
    max_epochs: int = -1,
    max_steps: int = -1,
    callbacks: Sequence[Callback] = (),
) -> L.Trainer:
    """A ``Trainer`` on ``config["trainer"]``'s recipe (accelerator, precision, determinism,
    clipping) on one device, without checkpoints, logger, validation or progress output.

    For benchmarks that compare data strategies or time training steps: they must measure the
    recipe the loop trains with, not a copy of it that drifts.
    """
    settings = config["trainer"]
    return L.Trainer(
        accelerator=settings["accelerator"],
        devices=1,
        precision=settings["precision"],
        deterministic=settings["deterministic"],
        max_epochs=max_epochs,
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        gradient_clip_val=settings.get("gradient_clip_val"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )


def fit(
    module: PerceptionModule,
    datamodule: PerceptionDataModule,
    trainer: L.Trainer,
    resume_from: Path | None,
) -> None:
    """``trainer.fit``, continuing from ``resume_from`` (weights, optimizer, schedule, loops)."""
    with warnings.catch_warnings():
        # Expected here: the directory also holds the run id and the lock, and the module
        # (not the datamodule) owns on_after_batch_transfer.
        for message in _EXPECTED_LIGHTNING_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)


@contextlib.contextmanager
def preserved_torch_determinism() -> Iterator[None]:
    """Lightning's ``deterministic=True`` flips process-global torch flags and leaves them.

    Restoring them keeps a training from changing the behaviour (and speed) of whatever the
    process runs next, e.g. other assets in the same Dagster worker or other tests.
    """
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_deterministic = torch.backends.cudnn.deterministic
    cudnn_benchmark = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_deterministic
        torch.backends.cudnn.benchmark = cudnn_benchmark
