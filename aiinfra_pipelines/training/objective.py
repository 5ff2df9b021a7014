"""What the perception network is trained to minimise, and on which views of a frame: the
weighted occupancy and lead-gap loss and the augmentations (brightness jitter, lane mirroring)
that run on the training device.

Pure tensor functions, apart from :class:`~.module.PerceptionModule` that calls them, so that
evaluation, benchmarks and tests compute exactly the loss that training minimised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aiinfra_pipelines.perception.contract import LANES


def images_to_float(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 N x 3 x H x W → float32 in [0, 1], the contract's ``images_to_input`` in torch.

    ``channels_last`` only changes the memory layout (values and shape are the same): oneDNN
    on CPU and cuDNN with mixed precision run these convolutions faster in NHWC.
    """
    floats = images.float().div_(255.0)
    return floats.contiguous(memory_format=torch.channels_last) if channels_last else floats


def brightness_jitter(
    images: torch.Tensor, amount: float, generator: torch.Generator
) -> torch.Tensor:
    """Multiply each image by a gain drawn uniformly from [1 - amount, 1 + amount], clipped."""
    gains = torch.empty(images.shape[0], 1, 1, 1, device=images.device)
    gains.uniform_(1.0 - amount, 1.0 + amount, generator=generator)
    return (images * gains).clamp_(0.0, 1.0)


def mirror_lanes(
    images: torch.Tensor,
    occupancy: torch.Tensor,
    probability: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip a random subset of frames upside down and swap their left/right lane labels.

    The camera is a top-down view, so a vertical flip is the mirror image of the scene: every
    lateral offset changes sign (left lane ↔ right lane) while distances along the road stay
    the same — a second, equally valid labelled frame for free. The lead gap is unchanged.
    """
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < probability
    if not bool(flip.any()):
        return images, occupancy
    images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-2), images)
    occupancy = torch.where(flip.view(-1, 1, 1), occupancy.flip(-2), occupancy)
    return images, occupancy


def near_bins(bin_edges_m: Sequence[float], near_range_m: float) -> np.ndarray:
    """Per distance bin, whether it starts before ``near_range_m``: the bins the planner acts on."""
    return np.array([float(edge) < near_range_m for edge in bin_edges_m[:-1]], dtype=bool)


def occupancy_cell_weights(
    bin_edges_m: Sequence[float],
    *,
    near_range_m: float,
    near_bin_weight: float,
    ego_lane_weight: float,
) -> torch.Tensor:
    """3 x bins loss weights: the cells the planner acts on count more, mean weight 1.

    The planner brakes, follows and changes lanes on the ego lane and on the bins that start
    before ``near_range_m``; a mistake there is a collision or a phantom brake, one in the far
    side bins is not. A cell gets ``ego_lane_weight`` on the ego (middle) lane times
    ``near_bin_weight`` when its bin starts before ``near_range_m``. Normalizing to mean 1
    keeps the occupancy loss on the scale the learning rate and ``lead_gap_weight`` were set
    for; all weights 1 is plain BCE.
    """
    if near_bin_weight <= 0 or ego_lane_weight <= 0:
        raise ValueError(
            f"loss weights must be > 0, got near_bin_weight={near_bin_weight}, "
            f"ego_lane_weight={ego_lane_weight}"
        )
    near = torch.where(torch.from_numpy(near_bins(bin_edges_m, near_range_m)), near_bin_weight, 1.0)
    lanes = torch.ones(LANES)
    lanes[LANES // 2] = ego_lane_weight
    weights = lanes.view(-1, 1) * near.view(1, -1)
    return weights / weights.mean()


def perception_loss(
    occupancy_logits: torch.Tensor,
    lead_gap_pred: torch.Tensor,
    occupancy: torch.Tensor,
    lead_gap: torch.Tensor,
    *,
    lead_gap_weight: float,
    smooth_l1_beta: float,
    cell_weights: torch.Tensor | None = None,
    pos_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, occupancy BCE-with-logits, lead-gap SmoothL1), all batch means.

    SmoothL1 rather than MSE for the gap: "no lead vehicle" frames sit at the range cap (1.0)
    and would otherwise dominate the gradient whenever the network hesitates about them.
    ``cell_weights`` (3 x bins, see :func:`occupancy_cell_weights`) weight the grid cells;
    ``pos_weight`` weights occupied cells against free ones (BCE's ``pos_weight``): most cells
    are free, and a network that under-predicts the rare occupied ones misses cars, the
    expensive error for a planner.
    """
    occupancy_loss = F.binary_cross_entropy_with_logits(
        occupancy_logits,
        occupancy,
        weight=None if cell_weights is None else cell_weights.to(occupancy_logits),
        pos_weight=None
        if pos_weight == 1.0
        else torch.tensor(float(pos_weight), device=occupancy_logits.device),
    )
    gap_loss = F.smooth_l1_loss(lead_gap_pred, lead_gap, beta=smooth_l1_beta)
    return occupancy_loss + lead_gap_weight * gap_loss, occupancy_loss, gap_loss


def distillation_loss(
    student_logits: torch.Tensor,
    student_gap: torch.Tensor,
    teacher_logits: torch.Tensor,
    teacher_gap: torch.Tensor,
    *,
    temperature: float,
    lead_gap_weight: float,
    smooth_l1_beta: float,
    cell_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The student's loss against the teacher's readings of the same (augmented) frames.

    Occupancy: BCE of the student's tempered logits against the teacher's tempered
    probabilities, times ``temperature**2`` (Hinton et al.: keeps the gradient's scale as the
    temperature softens the targets). A soft target carries what a hard label cannot: how sure
    the larger network is that a half-hidden car at the edge of a bin is there. Lead gap:
    SmoothL1 against the teacher's gap, with the label loss's beta and weight, so the two terms
    mix at the scale of the label loss.
    """
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}")
    soft_targets = torch.sigmoid(teacher_logits.detach() / temperature)
    occupancy_loss = F.binary_cross_entropy_with_logits(
        student_logits / temperature,
        soft_targets,
        weight=None if cell_weights is None else cell_weights.to(student_logits),
    ) * (temperature**2)
    gap_loss = F.smooth_l1_loss(student_gap, teacher_gap.detach(), beta=smooth_l1_beta)
    return occupancy_loss + lead_gap_weight * gap_loss


def loss_weighting(config: dict[str, Any]) -> dict[str, float]:
    """The occupancy weighting keys of ``training.yaml``'s ``loss:`` (1.0 = unweighted)."""
    loss = config["loss"]
    return {
        "pos_weight": float(loss.get("pos_weight", 1.0)),
        "near_range_m": float(loss.get("near_range_m", 0.0)),
        "near_bin_weight": float(loss.get("near_bin_weight", 1.0)),
        "ego_lane_weight": float(loss.get("ego_lane_weight", 1.0)),
    }
