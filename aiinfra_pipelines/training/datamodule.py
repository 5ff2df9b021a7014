"""Frames tables → tensors the perception network trains on.

Input is a frames table as ``anonymized_frames``/``training_dataset`` publish it (one row per
camera frame: raw rgb8 ``image`` bytes, ``image_height``/``image_width``, ``ground_truth`` JSON,
``lane_index``, ``lane_count``, ``log_id``). Images are decoded exactly once into one uint8
tensor (N x 3 x H x W, a quarter of the float32 size, so worker processes and pinned buffers
move little data); conversion to float and augmentation happen on the training device in
``PerceptionModule.on_after_batch_transfer``.

Bad input fails here, before a Trainer or an MLflow run exists, with a ``ValueError`` that names
the problem: an empty table, missing columns, frames whose size is not the camera contract's,
truncated image payloads, and non-finite ground truth or labels.

A training set may also hold a *transfer set*: frames without labels (no ground truth, or
none anyone paid to label) that the student learns from its teacher's readings alone
(``PerceptionModule`` with a teacher attached). Only their images are read and checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from aiinfra_pipelines.perception.contract import PerceptionSpec, decode_images, perception_spec
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .objective import near_bins

REQUIRED_COLUMNS: tuple[str, ...] = (
    "image",
    "image_height",
    "image_width",
    "ground_truth",
    "lane_index",
    "lane_count",
)
# What a transfer frame (no labels) must carry: the image alone.
IMAGE_COLUMNS: tuple[str, ...] = ("image", "image_height", "image_width")
_LABELLED_NUMERIC_COLUMNS: tuple[str, ...] = (
    "image_height",
    "image_width",
    "lane_index",
    "lane_count",
)
_GROUND_TRUTH_FIELDS: tuple[str, ...] = ("x", "y", "vx", "vy", "lane_offset")

Sample = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def labelled_rows(lead_gap: torch.Tensor) -> torch.Tensor:
    """Which samples of a batch carry labels (N bools): a transfer frame's lead gap is NaN.

    NaN marks "no label" because no labelled frame can hold it (``frames_to_arrays`` refuses
    NaN labels), and because the batch keeps the (image, occupancy, lead gap) shape every hook,
    step and checkpoint already use.
    """
    return torch.isfinite(lead_gap).reshape(-1)


def _where(frames: pd.DataFrame, mask: np.ndarray, limit: int = 3) -> str:
    """A short "which rows" hint for error messages: log ids and frame indices when present."""
    rows = frames.loc[mask]
    if "log_id" in rows and "frame_index" in rows:
        items = [
            f"{log}#{idx}" for log, idx in zip(rows["log_id"], rows["frame_index"], strict=True)
        ]
    else:
        items = [str(i) for i in rows.index]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def validate_frames(frames: pd.DataFrame, spec: PerceptionSpec, name: str = "frames") -> None:
    """Raise ``ValueError`` naming the first problem that would make ``frames`` untrainable.

    Ground truth is checked before labels are derived because the label function silently
    drops a vehicle whose position is NaN (NaN compares false with every bin edge): the frame
    would train as "lane free" — a wrong label, not an error — unless it is caught here.
    """
    _check_table(frames, name)
    _check_numeric_columns(frames, name, _LABELLED_NUMERIC_COLUMNS)
    _check_image_sizes(frames, spec, name)
    _check_image_payloads(frames, spec, name)
    _check_ground_truth(frames, name)


def validate_transfer_frames(
    frames: pd.DataFrame, spec: PerceptionSpec, name: str = "transfer_frames"
) -> None:
    """``validate_frames`` for frames without labels: their images are all that is read."""
    _check_table(frames, name, IMAGE_COLUMNS)
    _check_numeric_columns(frames, name, ("image_height", "image_width"))
    _check_image_sizes(frames, spec, name)
    _check_image_payloads(frames, spec, name)


def _check_table(
    frames: pd.DataFrame, name: str, required: tuple[str, ...] = REQUIRED_COLUMNS
) -> None:
    if not isinstance(frames, pd.DataFrame):
        raise ValueError(f"{name}: expected a pandas DataFrame, got {type(frames).__name__}")
    if len(frames) == 0:
        raise ValueError(f"{name} is empty: no frames to train or validate on")
    missing = [column for column in required if column not in frames.columns]
    if missing:
        raise ValueError(f"{name}: missing required columns {missing}")


def _check_numeric_columns(frames: pd.DataFrame, name: str, columns: tuple[str, ...]) -> None:
    for column in columns:
        values = pd.to_numeric(frames[column], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise ValueError(
                f"{name}: {int(bad.sum())} frames have a missing/NaN {column} "
                f"({_where(frames, bad)})"
            )


def _check_image_sizes(frames: pd.DataFrame, spec: PerceptionSpec, name: str) -> None:
    heights = frames["image_height"].to_numpy(dtype=np.int64)
    widths = frames["image_width"].to_numpy(dtype=np.int64)
    wrong_size = (heights != spec.image_height) | (widths != spec.image_width)
    if wrong_size.any():
        sizes = sorted({(int(h), int(w)) for h, w in zip(heights, widths, strict=True)})
        found = ", ".join(f"{h}x{w}" for h, w in sizes)
        raise ValueError(
            f"{name}: mismatched image sizes — the camera contract is "
            f"{spec.image_height}x{spec.image_width} (HxW) but found {found}; "
            f"{int(wrong_size.sum())} frames differ ({_where(frames, wrong_size)})"
        )


def _check_image_payloads(frames: pd.DataFrame, spec: PerceptionSpec, name: str) -> None:
    expected_bytes = spec.image_height * spec.image_width * 3
    lengths = np.array(
        [
            len(payload) if isinstance(payload, bytes | bytearray | memoryview) else -1
            for payload in frames["image"]
        ]
    )
    truncated = lengths != expected_bytes
    if truncated.any():
        raise ValueError(
            f"{name}: {int(truncated.sum())} image payloads are not {expected_bytes} bytes of "
            f"rgb8 {spec.image_height}x{spec.image_width} ({_where(frames, truncated)})"
        )


def _ground_truth_problem(payload: Any) -> str:
    """Why one frame's ground truth cannot be labelled ("" when it can)."""
    try:
        for vehicle in json.loads(payload):
            for field in _GROUND_TRUTH_FIELDS:
                if not math.isfinite(float(vehicle[field])):
                    return f"{field}={vehicle[field]}"
    except (TypeError, KeyError, ValueError) as error:
        return str(error)
    return ""


def _check_ground_truth(frames: pd.DataFrame, name: str) -> None:
    problems = [_ground_truth_problem(payload) for payload in frames["ground_truth"]]
    bad_truth = np.array([bool(problem) for problem in problems], dtype=bool)
    if bad_truth.any():
        first = next(problem for problem in problems if problem)
        raise ValueError(
            f"{name}: NaN/invalid ground truth in {int(bad_truth.sum())} frames, labels cannot "
            f"be derived ({_where(frames, bad_truth)}; first problem: {first})"
        )


def frames_to_arrays(
    frames: pd.DataFrame, spec: PerceptionSpec, name: str = "frames"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated (images uint8 N x H x W x 3, occupancy N x 3 x bins, lead gap N normalized)."""
    validate_frames(frames, spec, name)
    images = decode_images(list(frames["image"]), spec.image_height, spec.image_width)
    occupancy, lead_gap = ground_truth_labels(frames, spec)
    for label, values in (("occupancy", occupancy), ("lead gap", lead_gap)):
        bad = ~np.isfinite(values.reshape(len(frames), -1)).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{name}: NaN in {label} labels for {int(bad.sum())} frames ({_where(frames, bad)})"
            )
    return images, occupancy, lead_gap


class PerceptionDataset(Dataset[Sample]):
    """In-memory (image uint8 3 x H x W, occupancy 3 x bins, lead gap 1) samples of a frames table.

    Decoding and labelling once up front costs a second per thousand frames and makes every
    epoch after that pure tensor indexing, cheap enough for worker processes to stay ahead of
    the model.
    """

    def __init__(
        self,
        frames: pd.DataFrame,
        spec: PerceptionSpec | None = None,
        name: str = "frames",
        transfer: pd.DataFrame | None = None,
    ) -> None:
        """``transfer`` (frames without labels) follows ``frames``: its samples carry zero
        occupancy and a NaN lead gap (``labelled_rows``), targets only a teacher can fill."""
        self.spec = spec or perception_spec()
        images, occupancy, lead_gap = frames_to_arrays(frames, self.spec, name)
        self.labelled_count = len(frames)
        if transfer is not None and len(transfer):
            validate_transfer_frames(transfer, self.spec, f"{name} (transfer set)")
            unlabelled = decode_images(
                list(transfer["image"]), self.spec.image_height, self.spec.image_width
            )
            images = np.concatenate([images, unlabelled])
            occupancy = np.concatenate(
                [occupancy, np.zeros((len(transfer), *occupancy.shape[1:]), occupancy.dtype)]
            )
            lead_gap = np.concatenate([lead_gap, np.full(len(transfer), np.nan, lead_gap.dtype)])
        # N x H x W x 3 → N x 3 x H x W, contiguous so a sample is one memcpy.
        self.images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
        self.occupancy = torch.from_numpy(occupancy)
        self.lead_gap = torch.from_numpy(lead_gap).unsqueeze(1)

    @property
    def transfer_count(self) -> int:
        """Samples without labels (the transfer set), stored after the labelled ones."""
        return len(self) - self.labelled_count

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> Sample:
        return self.images[index], self.occupancy[index], self.lead_gap[index]


def ego_lane_balance_weights(
    occupancy: np.ndarray,
    road_types: np.ndarray | None,
    near: np.ndarray,
    strength: float,
) -> np.ndarray | None:
    """Per-frame sampling weights that temper the imbalance of "something close in my lane".

    Frames are grouped by road type and by whether any of the ego lane's ``near`` bins (a mask
    per bin, ``module.near_bins``) is occupied; a frame's weight is its group's size to the
    power ``-strength``, scaled so every road type keeps its share of the epoch. In a junction a
    car in the ego lane (crossing traffic, mostly) is in ~10 % of the frames and in view for two
    or three of them, so a plain shuffle shows the network few of the cases the planner must not
    miss; ``strength`` 1 would balance them fully, 0 is a plain shuffle (``None``: no weights).
    """
    if strength <= 0:
        return None
    occupied = np.asarray(occupancy)[:, 1, near].max(axis=1) >= 0.5
    roads = np.asarray(road_types) if road_types is not None else np.zeros(len(occupied))
    weights = np.zeros(len(occupied), dtype=np.float64)
    for road in np.unique(roads):
        in_road = roads == road
        for flag in (False, True):
            group = in_road & (occupied == flag)
            if group.any():
                weights[group] = float(group.sum()) ** -float(strength)
        weights[in_road] *= in_road.sum() / weights[in_road].sum()
    return weights


class EpochSeededShuffle(Sampler[int]):
    """A random permutation per epoch drawn from a generator seeded with ``seed + epoch``.

    Lightning calls ``set_epoch`` before every epoch (also after resuming from a checkpoint), so
    epoch k sees the same order whether or not the process was killed before it — the property
    that makes a resumed run match an uninterrupted one. A plain ``RandomSampler`` with one
    seeded generator would depend on how many epochs this process has already drawn.

    With ``weights`` (one per sample) an epoch is ``size`` draws with replacement in proportion
    to them instead of a permutation (:func:`ego_lane_balance_weights`).
    """

    def __init__(self, size: int, seed: int, weights: torch.Tensor | None = None) -> None:
        if weights is not None and len(weights) != size:
            raise ValueError(f"{len(weights)} sampling weights for {size} samples")
        self.size = size
        self.seed = seed
        self.epoch = 0
        self.weights = weights

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.weights is not None:
            draws = torch.multinomial(
                self.weights, self.size, replacement=True, generator=generator
            )
            return iter(draws.tolist())
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


class PerceptionDataModule(L.LightningDataModule):
    """Train/val loaders over two frames tables (already split by log upstream).

    Datasets are built (and validated) in the constructor, so bad input fails before a Trainer
    starts; under ``ddp_spawn`` they travel to the workers as compact uint8 tensors.
    ``transfer_frames`` (frames without labels) join the training set, shuffled among the
    labelled ones; validation stays labelled.
    """

    def __init__(
        self,
        train_frames: pd.DataFrame,
        val_frames: pd.DataFrame,
        *,
        batch_size: int,
        num_workers: int,
        pin_memory: bool,
        seed: int,
        spec: PerceptionSpec | None = None,
        multiprocessing_context: str | None = None,
        drop_last: bool = False,
        ego_lane_balance: float = 0.0,
        near_range_m: float = 0.0,
        transfer_frames: pd.DataFrame | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        has_transfer = transfer_frames is not None and len(transfer_frames) > 0
        if has_transfer and ego_lane_balance > 0:
            raise ValueError(
                "ego_lane_balance weights frames by their labels; a transfer set has none "
                "(set data.ego_lane_balance to 0 to train with one)"
            )
        self.spec = spec or perception_spec()
        self.train_dataset = PerceptionDataset(
            train_frames, self.spec, name="train_frames", transfer=transfer_frames
        )
        self.val_dataset = PerceptionDataset(val_frames, self.spec, name="val_frames")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.multiprocessing_context = multiprocessing_context
        self.drop_last = drop_last
        weights = ego_lane_balance_weights(
            self.train_dataset.occupancy.numpy(),
            train_frames["road_type"].to_numpy() if "road_type" in train_frames else None,
            near_bins(self.spec.bin_edges_m, near_range_m),
            ego_lane_balance,
        )
        self.sample_weights = None if weights is None else torch.from_numpy(weights)

    @classmethod
    def from_config(
        cls,
        train_frames: pd.DataFrame,
        val_frames: pd.DataFrame,
        config: dict[str, Any],
        *,
        seed: int,
        spec: PerceptionSpec | None = None,
        transfer_frames: pd.DataFrame | None = None,
    ) -> PerceptionDataModule:
        """Build from the ``data:`` section of ``training.yaml``."""
        data = config["data"]
        return cls(
            train_frames,
            val_frames,
            batch_size=int(data["batch_size"]),
            num_workers=int(data["num_workers"]),
            pin_memory=bool(data["pin_memory"]),
            seed=seed,
            spec=spec,
            multiprocessing_context=data.get("multiprocessing_context"),
            drop_last=bool(data.get("drop_last", False)),
            ego_lane_balance=float(data.get("ego_lane_balance", 0.0)),
            near_range_m=float(config["loss"]["near_range_m"]),
            transfer_frames=transfer_frames,
        )

    def _pin(self) -> bool:
        """Pinned memory only helps host→accelerator copies; on CPU it is a wasted copy."""
        trainer = self.trainer  # None until attached to a Trainer
        if trainer is None:
            return False
        return self.pin_memory and trainer.strategy.root_device.type != "cpu"

    def _loader(self, dataset: PerceptionDataset, sampler: Sampler[int] | None) -> DataLoader:
        workers = self.num_workers
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            shuffle=False,
            num_workers=workers,
            pin_memory=self._pin(),
            persistent_workers=workers > 0,
            multiprocessing_context=self.multiprocessing_context if workers > 0 else None,
            # Seeds the workers' base seed; Lightning's seed_everything(workers=True) derives
            # each worker's RNG from it, so worker-side randomness is reproducible too.
            generator=torch.Generator().manual_seed(self.seed),
            drop_last=self.drop_last and sampler is not None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(
            self.train_dataset,
            EpochSeededShuffle(len(self.train_dataset), self.seed, self.sample_weights),
        )

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, None)
