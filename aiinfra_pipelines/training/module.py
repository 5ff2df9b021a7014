"""The perception network as a LightningModule: loss, validation metrics, optimizer, schedule.

Every hyperparameter is a constructor argument of a plain type and goes through
``save_hyperparameters``, so a checkpoint alone rebuilds the module
(``PerceptionModule.load_from_checkpoint(path)``) and MLflow sees exactly what trained it.
Validation metrics are the pure functions of ``training.metrics`` — the same numbers offline
evaluation reports for the same predictions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.network import STAGES, PerceptionNet

from . import metrics
from .datamodule import labelled_rows
from .objective import (
    brightness_jitter,
    distillation_loss,
    images_to_float,
    loss_weighting,
    mirror_lanes,
    occupancy_cell_weights,
    perception_loss,
)

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
SCHEDULERS = ("cosine", "step", "none")

# Names of the per-epoch metrics (the MLflow history and the progress lines use these).
TRAIN_LOSS = "train_loss"
VAL_LOSS = "val_loss"
VAL_ACCURACY = "val_occupancy_accuracy"
VAL_F1 = "val_occupancy_f1"
VAL_LEAD_GAP_MAE = "val_lead_gap_mae_m"
EPOCH_METRICS: tuple[str, ...] = (TRAIN_LOSS, VAL_LOSS, VAL_ACCURACY, VAL_F1, VAL_LEAD_GAP_MAE)


def _grid_geometry(spec: PerceptionSpec, head: str, stages: int) -> dict[str, Any]:
    """``model.head``: ``dense`` (the trunk alone) or ``dense+grid`` (plus shared detectors).

    The grid head needs where the camera puts each distance bin and each column ahead of ego
    (fleet.yaml ``camera``); kept as plain lists so the checkpoint's hyperparameters rebuild it.
    """
    if head == "dense":
        return {}
    if head != "dense+grid":
        raise ValueError(f"model.head must be dense or dense+grid, got {head!r}")
    from aiinfra_pipelines.fleet.camera import EgoCamera
    from aiinfra_pipelines.perception.network import ahead_column_distances, bin_column_ranges

    camera = EgoCamera.load()
    stride = 2 ** (stages - 1)
    ranges = bin_column_ranges(spec, camera.ego_u_px, camera.scaling_px_per_m, stride)
    first, distances = ahead_column_distances(
        spec, camera.ego_u_px, camera.scaling_px_per_m, stride
    )
    return {
        "grid_ranges": [list(r) for r in ranges],
        "grid_ahead": [first, list(distances)],
    }


class PerceptionModule(L.LightningModule):
    """Trains ``PerceptionNet``: occupancy BCE + weighted lead-gap SmoothL1, AdamW + schedule."""

    def __init__(
        self,
        image_height: int,
        image_width: int,
        bin_edges_m: Sequence[float],
        max_range_m: float,
        *,
        width: int,
        hidden: int,
        lr: float,
        weight_decay: float,
        lead_gap_weight: float,
        smooth_l1_beta: float,
        scheduler: str,
        min_lr_ratio: float,
        step_epochs: int,
        gamma: float,
        brightness_jitter: float,
        mirror_probability: float,
        occupancy_threshold: float,
        augmentation_seed: int,
        channels_last: bool = False,
        pos_weight: float = 1.0,
        near_range_m: float = 0.0,
        near_bin_weight: float = 1.0,
        ego_lane_weight: float = 1.0,
        pool: Sequence[int] | None = (2, 5),
        grid_ranges: Sequence[Sequence[int]] | None = None,
        grid_ahead: Sequence[Any] | None = None,
        stages: int = STAGES,
        stem_stride: int = 2,
        mirror_average: bool = False,
    ) -> None:
        super().__init__()
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        if not 0.0 <= brightness_jitter < 1.0:
            raise ValueError(f"brightness_jitter must be within [0, 1), got {brightness_jitter}")
        if not 0.0 <= mirror_probability <= 1.0:
            raise ValueError(f"mirror_probability must be within [0, 1], got {mirror_probability}")
        self.save_hyperparameters()
        self.spec = PerceptionSpec(
            image_height=int(image_height),
            image_width=int(image_width),
            bin_edges_m=tuple(float(edge) for edge in bin_edges_m),
            max_range_m=float(max_range_m),
        )
        self.net = PerceptionNet(
            self.spec,
            width=width,
            hidden=hidden,
            pool=None if pool is None else (int(pool[0]), int(pool[1])),
            grid_ranges=None if grid_ranges is None else tuple(tuple(r) for r in grid_ranges),
            grid_ahead=None
            if grid_ahead is None
            else (int(grid_ahead[0]), tuple(float(d) for d in grid_ahead[1])),
            stages=int(stages),
            stem_stride=int(stem_stride),
            mirror_average=bool(mirror_average),
        )
        # Not persistent: derived from the hyperparameters, so a checkpoint rebuilds it.
        self.register_buffer(
            "cell_weights",
            occupancy_cell_weights(
                self.spec.bin_edges_m,
                near_range_m=near_range_m,
                near_bin_weight=near_bin_weight,
                ego_lane_weight=ego_lane_weight,
            ),
            persistent=False,
        )
        self._val_outputs: list[tuple[torch.Tensor, ...]] = []
        self._distillation: Distillation | None = None

    def attach_teacher(self, teacher: PerceptionNet, weight: float, temperature: float) -> None:
        """Train against ``teacher``'s readings as well as the labels (``training.yaml``
        ``distillation``): loss = (1 - weight) x label loss + weight x distillation loss.

        The teacher is held outside the module's parameters and state dict: it is frozen, never
        saved in the student's checkpoints (the student's file stays the car's size) and the
        optimizer never sees it. A resumed run attaches it again (the train function does).
        """
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"distillation weight must be within (0, 1], got {weight}")
        if temperature <= 0:
            raise ValueError(f"distillation temperature must be > 0, got {temperature}")
        teacher = teacher.eval()
        for parameter in teacher.parameters():
            parameter.requires_grad_(False)
        self._distillation = Distillation(teacher, float(weight), float(temperature))

    def on_fit_start(self) -> None:
        if self._distillation is not None:
            self._distillation.teacher.to(self.device)
            return
        dataset = getattr(self.trainer.datamodule, "train_dataset", None)
        if getattr(dataset, "transfer_count", 0):
            # Their NaN lead gaps would turn the label loss into NaN from the first batch.
            raise ValueError(
                f"the training set holds {dataset.transfer_count} frames without labels (a "
                "transfer set) and no teacher is attached: only a teacher can give them targets"
            )

    @classmethod
    def from_config(
        cls, spec: PerceptionSpec, config: dict[str, Any], seed: int
    ) -> PerceptionModule:
        """Build from ``training.yaml`` sections model/loss/optimizer/scheduler/augmentation."""
        scheduler = config["scheduler"]
        return cls(
            spec.image_height,
            spec.image_width,
            list(spec.bin_edges_m),
            spec.max_range_m,
            width=int(config["model"]["width"]),
            hidden=int(config["model"]["hidden"]),
            lr=float(config["optimizer"]["lr"]),
            weight_decay=float(config["optimizer"]["weight_decay"]),
            lead_gap_weight=float(config["loss"]["lead_gap_weight"]),
            smooth_l1_beta=float(config["loss"]["smooth_l1_beta"]),
            scheduler=str(scheduler["name"]),
            min_lr_ratio=float(scheduler["min_lr_ratio"]),
            step_epochs=int(scheduler["step_epochs"]),
            gamma=float(scheduler["gamma"]),
            brightness_jitter=float(config["augmentation"]["brightness_jitter"]),
            mirror_probability=float(config["augmentation"]["mirror_probability"]),
            occupancy_threshold=float(config["metrics"]["occupancy_threshold"]),
            augmentation_seed=int(seed),
            channels_last=bool(config["model"].get("channels_last", False)),
            **loss_weighting(config),
            pool=config["model"].get("pool", (2, 5)),
            stages=int(config["model"].get("stages", STAGES)),
            stem_stride=int(config["model"].get("stem_stride", 2)),
            mirror_average=bool(config["model"].get("mirror_average", False)),
            **_grid_geometry(
                spec,
                config["model"].get("head", "dense"),
                int(config["model"].get("stages", STAGES)),
            ),
        )

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(images)

    # -- data on the device ---------------------------------------------------------------

    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        """uint8 → float on the device (4x less host→device traffic), then augment if training.

        The augmentation generator is seeded from (seed, global step, rank): a resumed run
        draws the same gains for step k as an uninterrupted one, regardless of worker state.
        """
        images, occupancy, lead_gap = batch
        images = images_to_float(images, self.hparams.channels_last)
        if self._trainer is None or not self.trainer.training:
            return images, occupancy, lead_gap
        generator = torch.Generator(device=images.device)
        generator.manual_seed(
            (self.hparams.augmentation_seed * 1_000_003 + self.global_step) * 64 + self.global_rank
        )
        if self.hparams.mirror_probability > 0:
            images, occupancy = mirror_lanes(
                images, occupancy, self.hparams.mirror_probability, generator
            )
        if self.hparams.brightness_jitter > 0:
            images = brightness_jitter(images, self.hparams.brightness_jitter, generator)
        return images, occupancy, lead_gap

    # -- steps ----------------------------------------------------------------------------

    def _label_loss(
        self,
        occupancy_logits: torch.Tensor,
        lead_gap_pred: torch.Tensor,
        occupancy: torch.Tensor,
        lead_gap: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``perception_loss`` with this module's weighting: (total, occupancy, lead gap)."""
        return perception_loss(
            occupancy_logits,
            lead_gap_pred,
            occupancy,
            lead_gap,
            lead_gap_weight=self.hparams.lead_gap_weight,
            smooth_l1_beta=self.hparams.smooth_l1_beta,
            cell_weights=self.cell_weights,
            pos_weight=self.hparams.pos_weight,
        )

    def _losses(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        images, occupancy, lead_gap = batch
        occupancy_logits, lead_gap_pred = self.net(images)
        total, occupancy_loss, gap_loss = self._label_loss(
            occupancy_logits, lead_gap_pred, occupancy, lead_gap
        )
        return total, occupancy_loss, gap_loss, occupancy_logits, lead_gap_pred

    def _distilled_loss(self, batch: Batch, distillation: Distillation) -> torch.Tensor:
        """The label loss on the batch's labelled rows mixed with the teacher's on every row.

        Transfer frames (``datamodule.labelled_rows``: no labels) are learned from the teacher
        alone; a batch of only such frames has no label term.
        """
        images, occupancy, lead_gap = batch
        occupancy_logits, lead_gap_pred = self.net(images)
        labelled = labelled_rows(lead_gap)
        label_loss = None
        if bool(labelled.any()):
            label_loss, _, _ = self._label_loss(
                occupancy_logits[labelled],
                lead_gap_pred[labelled],
                occupancy[labelled],
                lead_gap[labelled],
            )
        return distillation.mix(
            label_loss, occupancy_logits, lead_gap_pred, images, self.hparams, self.cell_weights
        )

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        if self._distillation is None:
            total = self._losses(batch)[0]
        else:
            total = self._distilled_loss(batch, self._distillation)
        # One epoch-mean metric only: each logged value costs ~0.5-1 ms per step in
        # Lightning's result collection, a few percent of a CPU step of this small network.
        self.log(
            TRAIN_LOSS,
            total,
            on_step=False,
            on_epoch=True,
            batch_size=batch[0].shape[0],
            sync_dist=True,
        )
        return total

    def on_validation_epoch_start(self) -> None:
        self._val_outputs = []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        total, _, _, occupancy_logits, lead_gap_pred = self._losses(batch)
        self.log(
            VAL_LOSS,
            total,
            on_step=False,
            on_epoch=True,
            batch_size=batch[0].shape[0],
            sync_dist=True,
        )
        self._val_outputs.append(
            (torch.sigmoid(occupancy_logits).detach(), batch[1], lead_gap_pred.detach(), batch[2])
        )

    def on_validation_epoch_end(self) -> None:
        """Epoch-level metrics over the whole val set (F1 does not average over batches)."""
        if not self._val_outputs:
            return
        prob, target, gap_pred, gap_target = (
            torch.cat([output[i] for output in self._val_outputs]) for i in range(4)
        )
        self._val_outputs = []
        if self.trainer.world_size > 1:
            prob, target, gap_pred, gap_target = (
                self.all_gather(tensor).flatten(0, 1)
                for tensor in (prob, target, gap_pred, gap_target)
            )
        scores = validation_scores(
            prob.float().cpu().numpy(),
            target.cpu().numpy(),
            gap_pred.float().cpu().numpy(),
            gap_target.cpu().numpy(),
            threshold=self.hparams.occupancy_threshold,
            max_range_m=self.spec.max_range_m,
        )
        # Identical on every rank after the gather; sync_dist only averages equal values (once
        # per epoch) and tells Lightning the epoch value is global.
        self.log_dict(scores, on_step=False, on_epoch=True, sync_dist=True)

    # -- optimization ---------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW and a per-step schedule (exactly restorable from a checkpoint on resume)."""
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        name = self.hparams.scheduler
        if name == "none":
            return {"optimizer": optimizer}
        total_steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(total_steps):
            raise ValueError("a learning-rate schedule needs max_epochs (or max_steps) to be set")
        total_steps = max(1, int(total_steps))
        if name == "cosine":
            scheduler: torch.optim.lr_scheduler.LRScheduler = (
                torch.optim.lr_scheduler.CosineAnnealingLR(
                    optimizer,
                    T_max=total_steps,
                    eta_min=self.hparams.lr * self.hparams.min_lr_ratio,
                )
            )
        else:
            max_epochs = max(1, self.trainer.max_epochs or 1)
            steps_per_epoch = max(1, total_steps // max_epochs)
            scheduler = torch.optim.lr_scheduler.StepLR(
                optimizer,
                step_size=self.hparams.step_epochs * steps_per_epoch,
                gamma=self.hparams.gamma,
            )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }


class Distillation:
    """A frozen teacher and how much its readings weigh in the student's training loss."""

    def __init__(self, teacher: PerceptionNet, weight: float, temperature: float) -> None:
        self.teacher = teacher
        self.weight = weight
        self.temperature = temperature

    def mix(
        self,
        label_loss: torch.Tensor | None,
        occupancy_logits: torch.Tensor,
        lead_gap_pred: torch.Tensor,
        images: torch.Tensor,
        hparams: Any,
        cell_weights: torch.Tensor,
    ) -> torch.Tensor:
        """(1 - weight) x label loss + weight x loss against the teacher on the same images.

        The teacher reads the augmented batch the student reads, in eval mode: with
        ``mirror_average`` that is its two-view reading, the best it can tell. ``label_loss``
        ``None`` (a batch of transfer frames only): the teacher's loss alone.
        """
        with torch.no_grad():
            teacher_logits, teacher_gap = self.teacher(images)
        soft = distillation_loss(
            occupancy_logits,
            lead_gap_pred,
            teacher_logits,
            teacher_gap,
            temperature=self.temperature,
            lead_gap_weight=hparams.lead_gap_weight,
            smooth_l1_beta=hparams.smooth_l1_beta,
            cell_weights=cell_weights,
        )
        if label_loss is None:
            return soft
        return (1.0 - self.weight) * label_loss + self.weight * soft


def validation_scores(
    prob: np.ndarray,
    target: np.ndarray,
    gap_pred: np.ndarray,
    gap_target: np.ndarray,
    *,
    threshold: float,
    max_range_m: float,
) -> dict[str, float]:
    """The val_* metrics of one pass (shared by the epoch loop and the final evaluation)."""
    return {
        VAL_ACCURACY: metrics.occupancy_accuracy(prob, target, threshold),
        VAL_F1: metrics.occupancy_f1(prob, target, threshold),
        VAL_LEAD_GAP_MAE: metrics.lead_gap_mae_m(gap_pred, gap_target, max_range_m),
    }
