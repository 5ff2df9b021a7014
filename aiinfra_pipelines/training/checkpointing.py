"""The checkpoint directory: durable writes, the resume point, and one trainer at a time.

A training run must survive a SIGKILL or power loss at any instant and resume where it stopped,
so everything written into ``checkpoint_dir`` goes through a temporary file, fsync and rename,
and the directory is locked for the process that trains into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch.plugins import TorchCheckpointIO

LAST_CHECKPOINT = "last.ckpt"
RUN_ID_FILE = "mlflow_run_id"
LOCK_FILE = ".training.lock"
# Marks a checkpoint rewritten without its training state (.checkpoint_tiers).
TIER_KEY = "aiinfra_checkpoint_tier"
WEIGHTS_ONLY = "weights-only"
# What an exact resume restores besides the weights: optimizer moments, schedule, loop counters.
_TRAINING_STATE_KEYS = ("optimizer_states", "lr_schedulers", "loops")


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` survive a power loss, not only a process kill."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` through a sibling temporary file: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


class DurableCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a sibling temporary file, fsynced, then renamed into place.

    Lightning's own save stages through a temp file in the system temp dir and moves it, which
    is a copy (not atomic) when that dir is on another filesystem, and never fsyncs. Here a
    SIGKILL or power loss at any instant leaves either the previous or the new ``last.ckpt``,
    never a torn one that would make the resume itself crash.
    """

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | Path,
        storage_options: Any | None = None,
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        atomic_write_bytes(Path(path), lambda handle: torch.save(checkpoint, handle))


def is_full_state(checkpoint: dict[str, Any]) -> bool:
    """Whether a loaded checkpoint holds the full training state an exact resume needs."""
    return checkpoint.get(TIER_KEY) != WEIGHTS_ONLY and all(
        key in checkpoint for key in _TRAINING_STATE_KEYS
    )


def require_full_state(checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse a weights-only checkpoint where training would continue from it.

    Resuming from weights alone would restart AdamW's moments and the schedule: the run would
    silently diverge from an uninterrupted one. Such a file is a warm start's or an
    evaluation's weights (``PerceptionModule.load_from_checkpoint``), never a resume point.
    """
    if not is_full_state(checkpoint):
        missing = [key for key in _TRAINING_STATE_KEYS if key not in checkpoint]
        raise ValueError(
            f"{path} is a weights-only checkpoint (no {', '.join(missing)}): training cannot "
            "resume from it exactly; use it as a warm start's weights, or resume from a "
            "full-state checkpoint (last.ckpt)"
        )


def completed_epochs(checkpoint_path: Path) -> int:
    """Epochs fully trained in a Lightning checkpoint saved at the end of a training epoch.

    Only a full-state checkpoint counts: a weights-only one is refused (``ValueError``).
    """
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False, mmap=True)
    require_full_state(checkpoint, checkpoint_path)
    progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
    return int(progress["processed"])


def resume_point(checkpoint_dir: Path) -> tuple[Path, int | None]:
    """``last.ckpt`` in ``checkpoint_dir`` and the epochs it completed (``None``: fresh start)."""
    last = checkpoint_dir / LAST_CHECKPOINT
    return last, (completed_epochs(last) if last.is_file() else None)


@contextlib.contextmanager
def exclusive(checkpoint_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Refuse a second concurrent training into the same directory.

    A POSIX record lock (``lockf``) belongs to the process: the kernel drops it when the
    process dies, so a killed run never leaves a stale lock, and DataLoader workers forked
    from it do not inherit it. Only global rank 0 writes into the directory, so only it
    locks (``enabled``); the other ranks pass through.
    """
    if not enabled:
        yield
        return
    handle = open(checkpoint_dir / LOCK_FILE, "a+b")  # noqa: SIM115 - held for the block
    try:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            raise RuntimeError(
                f"another process is training into {checkpoint_dir} (lock {LOCK_FILE} is held)"
            ) from error
        for stale in checkpoint_dir.glob(".*.tmp"):  # half-written files of a killed run
            stale.unlink(missing_ok=True)
        yield
    finally:
        handle.close()
