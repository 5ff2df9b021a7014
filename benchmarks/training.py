"""Training throughput: the Lightning training step vs a plain PyTorch loop; prints figures.

Both sides train the same ``PerceptionNet`` (same seed-initialized weights) on the same fleet
frames with the same batch size and number of optimizer steps, in this one process, and do the
same work per step: DataLoader (workers and sampler from ``resources/training.yaml``), uint8 →
float on the device, brightness jitter, BCE + SmoothL1 loss, backward, gradient clipping,
AdamW, per-step cosine schedule, under the same ``deterministic`` setting. The difference is
what Lightning itself costs per step (hooks, logging of ``train_loss``, progress tracking).
Passes alternate (plain, Lightning, plain, ...) so load changes on a shared machine hit both;
the median and the best pass of each side are reported (the best is the least disturbed).

    .venv/bin/python benchmarks/training.py [--vehicles 2] [--episodes 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import lightning as L
import pandas as pd
import torch
from torch.utils.data import DataLoader

from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.ingest.tables import frames_table
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training.datamodule import EpochSeededShuffle, PerceptionDataModule
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.objective import (
    brightness_jitter,
    images_to_float,
    perception_loss,
)
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.trainer import scratch_trainer

BENCH_KEY = b"b" * 32
warnings.filterwarnings("ignore", message=r"You have overridden `on_after_batch_transfer`")


def fleet_frames(vehicles: int, episodes: int, seed: int) -> pd.DataFrame:
    logs = drive_fleet(vehicles, episodes, seed)
    return pd.concat(
        [frames_table(anonymize_log(log, BENCH_KEY)) for log in logs], ignore_index=True
    )


class StepTimer(L.Callback):
    """Wall time from the start of optimizer step ``warmup`` to the end of training."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.started: float | None = None
        self.elapsed = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.warmup and self.started is None:
            self.started = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.started is not None, "fewer steps than warmup"
        self.elapsed = time.perf_counter() - self.started


def lightning_pass(
    frames: pd.DataFrame, config: dict[str, Any], warmup: int, steps: int, seed: int
) -> float:
    """Seconds for ``steps`` Lightning training steps (after ``warmup`` steps)."""
    L.seed_everything(seed, workers=True, verbose=False)
    spec = perception_spec()
    datamodule = PerceptionDataModule.from_config(frames, frames, config, seed=seed, spec=spec)
    module = PerceptionModule.from_config(spec, config, seed)
    timer = StepTimer(warmup)
    trainer = scratch_trainer(config, max_steps=warmup + steps, callbacks=[timer])
    trainer.fit(module, datamodule=datamodule)
    return timer.elapsed


def plain_pass(
    frames: pd.DataFrame, config: dict[str, Any], warmup: int, steps: int, seed: int
) -> float:
    """Seconds for ``steps`` hand-written training steps doing the same work per step."""
    L.seed_everything(seed, workers=True, verbose=False)
    spec = perception_spec()
    datamodule = PerceptionDataModule.from_config(frames, frames, config, seed=seed, spec=spec)
    module = PerceptionModule.from_config(spec, config, seed)  # same init as the other pass
    network = module.net
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    network.to(device).train()
    hp = module.hparams
    data = config["data"]
    workers = int(data["num_workers"])
    loader = DataLoader(
        datamodule.train_dataset,
        batch_size=int(data["batch_size"]),
        sampler=EpochSeededShuffle(len(datamodule.train_dataset), seed),
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=bool(data["pin_memory"]) and device.type != "cpu",
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer = torch.optim.AdamW(network.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=warmup + steps, eta_min=hp.lr * hp.min_lr_ratio
    )
    clip = config["trainer"].get("gradient_clip_val")
    torch.use_deterministic_algorithms(bool(config["trainer"]["deterministic"]))
    step, epoch, started = 0, 0, 0.0
    try:
        while step < warmup + steps:
            loader.sampler.set_epoch(epoch)
            for images, occupancy, lead_gap in loader:
                if step == warmup:
                    started = time.perf_counter()
                images = images_to_float(images.to(device, non_blocking=True), hp.channels_last)
                occupancy = occupancy.to(device, non_blocking=True)
                lead_gap = lead_gap.to(device, non_blocking=True)
                generator = torch.Generator(device=device).manual_seed(seed + step)
                if hp.brightness_jitter > 0:
                    images = brightness_jitter(images, hp.brightness_jitter, generator)
                logits, gap = network(images)
                loss, _, _ = perception_loss(
                    logits,
                    gap,
                    occupancy,
                    lead_gap,
                    lead_gap_weight=hp.lead_gap_weight,
                    smooth_l1_beta=hp.smooth_l1_beta,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(network.parameters(), clip)
                optimizer.step()
                scheduler.step()
                loss.detach()  # (Lightning keeps the detached loss for its epoch mean)
                step += 1
                if step == warmup + steps:
                    break
            epoch += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started
    finally:
        torch.use_deterministic_algorithms(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vehicles", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed optimizer steps per pass")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--passes", type=int, default=5, help="passes per side")
    parser.add_argument("--workers", type=int, default=None, help="override data.num_workers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    overrides: dict[str, Any] = {}
    if args.workers is not None:
        overrides["data"] = {"num_workers": args.workers}
    config = load_training_config(overrides)
    batch = int(config["data"]["batch_size"])
    started = time.perf_counter()
    frames = fleet_frames(args.vehicles, args.episodes, args.seed)
    print(
        f"{len(frames)} fleet frames in {time.perf_counter() - started:.1f} s; batch {batch}, "
        f"{args.steps} timed steps (+{args.warmup} warm-up) per pass, "
        f"num_workers {config['data']['num_workers']}, torch threads {torch.get_num_threads()}, "
        f"deterministic {config['trainer']['deterministic']}"
    )

    plain, lightning = [], []
    for index in range(args.passes):
        plain.append(plain_pass(frames, config, args.warmup, args.steps, args.seed))
        lightning.append(lightning_pass(frames, config, args.warmup, args.steps, args.seed))
        print(
            f"  pass {index + 1}: plain {args.steps * batch / plain[-1]:7.1f} samples/s   "
            f"lightning {args.steps * batch / lightning[-1]:7.1f} samples/s"
        )
    for label, pick in (("median", statistics.median), ("best", min)):
        plain_s, lightning_s = pick(plain), pick(lightning)
        plain_rate = args.steps * batch / plain_s
        lightning_rate = args.steps * batch / lightning_s
        print(
            f"{label:6s} of {args.passes}: plain PyTorch loop {plain_rate:7.1f} samples/s, "
            f"Lightning {lightning_rate:7.1f} samples/s, ratio Lightning/plain "
            f"{lightning_rate / plain_rate:.3f} "
            f"({(lightning_s - plain_s) / args.steps * 1e3:+.2f} ms per step)"
        )


if __name__ == "__main__":
    main()
