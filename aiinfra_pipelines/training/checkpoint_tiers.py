"""Checkpoint tiers: the newest per-epoch checkpoints keep a full training state, older ones
only the weights (``training.yaml`` ``checkpoint``).

Why: a full Lightning checkpoint carries AdamW's two moment buffers per weight, the schedule
and the loop state — about three times the weights' bytes — and only a resume point needs
them. Older epochs stay useful as weights (to evaluate, compare or warm-start from) for a third
of the disk on the shared checkpoint volume. ``last.ckpt``, the resume point, is always written
in full by ``ModelCheckpoint`` and never touched here; a weights-only file is refused as a
resume point (:func:`.checkpointing.require_full_state`).

Every rewrite goes through :func:`.checkpointing.atomic_write_bytes` (temporary file, fsync,
rename), and the tiers are recomputed from the directory itself at every epoch end, so a kill
between a save and a rewrite is repaired by the next epoch instead of leaving a torn file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from .checkpointing import TIER_KEY, WEIGHTS_ONLY, atomic_write_bytes, is_full_state

EPOCH_FILENAME = "epoch={epoch:03d}"
_EPOCH_FILE = re.compile(r"^epoch=(\d+)\.ckpt$")
# What a weights-only checkpoint keeps: enough for ``PerceptionModule.load_from_checkpoint``
# (weights + hyper-parameters) and to say which epoch it is. Everything else (optimizer and
# scheduler state, loops, callbacks, precision-plugin state) is training state.
WEIGHTS_ONLY_KEYS = (
    "epoch",
    "global_step",
    "pytorch-lightning_version",
    "state_dict",
    "hparams_name",
    "hyper_parameters",
    "hparams_type",
)


@dataclass(frozen=True)
class CheckpointRetention:
    """``training.yaml`` ``checkpoint``: how often to save and how many files of each tier.

    ``save_top_k`` per-epoch files are kept besides ``last.ckpt`` (the newest; -1 keeps all);
    the newest ``full_state_keep`` of them keep the full training state, older ones only the
    weights.
    """

    every_n_epochs: int
    save_top_k: int
    full_state_keep: int

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> CheckpointRetention:
        """Validated from the ``checkpoint`` mapping; a bad value fails before any training."""
        retention = cls(
            every_n_epochs=int(section["every_n_epochs"]),
            save_top_k=int(section["save_top_k"]),
            full_state_keep=int(section["full_state_keep"]),
        )
        if retention.every_n_epochs < 1:
            raise ValueError(
                f"checkpoint.every_n_epochs must be >= 1, got {retention.every_n_epochs}"
            )
        if retention.save_top_k < -1:
            raise ValueError(f"checkpoint.save_top_k must be >= -1, got {retention.save_top_k}")
        if retention.full_state_keep < 0:
            raise ValueError(
                f"checkpoint.full_state_keep must be >= 0, got {retention.full_state_keep}"
            )
        return retention


def epoch_checkpoints(directory: Path) -> list[Path]:
    """The per-epoch checkpoint files in ``directory``, newest epoch first."""
    found = [
        (int(match.group(1)), path)
        for path in directory.glob("epoch=*.ckpt")
        if (match := _EPOCH_FILE.match(path.name))
    ]
    return [path for _, path in sorted(found, reverse=True)]


def weights_only(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The weights-only tier of a full checkpoint: weights, hyper-parameters, epoch and step."""
    kept = {key: checkpoint[key] for key in WEIGHTS_ONLY_KEYS if key in checkpoint}
    return {**kept, TIER_KEY: WEIGHTS_ONLY}


def demote(path: Path) -> bool:
    """Rewrite ``path`` weights-only, atomically; ``False`` when it already was.

    The structure is read memory-mapped, so checking an already demoted file costs no tensor
    reads.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    if not is_full_state(checkpoint):
        return False
    slim = weights_only(checkpoint)
    atomic_write_bytes(path, lambda handle: torch.save(slim, handle))
    return True


def apply_tiers(directory: Path, retention: CheckpointRetention) -> None:
    """Delete per-epoch files beyond ``save_top_k`` and demote those beyond ``full_state_keep``.

    Derived from the files in ``directory`` alone (not from in-memory state), so it is
    idempotent and a resumed run repairs whatever a kill left half-done.
    """
    files = epoch_checkpoints(directory)
    if retention.save_top_k >= 0:
        for stale in files[retention.save_top_k :]:
            stale.unlink(missing_ok=True)
        files = files[: retention.save_top_k]
    for older in files[retention.full_state_keep :]:
        demote(older)


class TieredModelCheckpoint(ModelCheckpoint):
    """Lightning's end-of-epoch ``ModelCheckpoint`` plus :func:`apply_tiers` after each save.

    Lightning itself keeps every per-epoch file (``save_top_k=-1``: with no monitored metric
    it cannot keep "the newest k" for k > 1) and ``last.ckpt``; retention is applied here, on
    global rank 0 only, the one rank that writes into the directory. ``last.ckpt`` is always
    saved, every epoch, with the full state: it is the resume point. The version counter is off
    so a resumed run overwrites its own files instead of writing ``-v1`` copies beside them.
    """

    def __init__(self, dirpath: Path, retention: CheckpointRetention) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=EPOCH_FILENAME,
            auto_insert_metric_name=False,
            save_top_k=0 if retention.save_top_k == 0 else -1,
            save_last=True,
            every_n_epochs=retention.every_n_epochs,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )
        self.retention = retention

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if trainer.is_global_zero and self.dirpath is not None:
            apply_tiers(Path(self.dirpath), self.retention)


def checkpoint_callback(checkpoint_dir: Path, settings: Mapping[str, Any]) -> ModelCheckpoint:
    """End-of-epoch, tiered checkpoints into ``checkpoint_dir`` (``training.yaml`` checkpoint)."""
    return TieredModelCheckpoint(checkpoint_dir, CheckpointRetention.from_config(settings))
