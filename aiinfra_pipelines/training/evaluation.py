"""Final validation metrics of a trained network over a whole dataset.

Per-epoch validation in Lightning averages per batch; the number recorded as the run's outcome
(``final_*`` in MLflow, the asset's metadata) is computed once over every frame with the same
loss and metric definitions, so it continues the per-epoch curves.
"""

from __future__ import annotations

import torch

from aiinfra_pipelines.perception.network import PerceptionNet

from .datamodule import PerceptionDataset
from .module import VAL_LOSS, validation_scores
from .objective import perception_loss


@torch.no_grad()
def evaluate_network(
    network: PerceptionNet,
    dataset: PerceptionDataset,
    *,
    batch_size: int,
    occupancy_threshold: float,
    lead_gap_weight: float,
    smooth_l1_beta: float,
    cell_weights: torch.Tensor | None = None,
    pos_weight: float = 1.0,
) -> dict[str, float]:
    """val_* metrics of ``network`` (eval mode, its current device) over a whole dataset.

    ``val_loss`` is the training loss (same cell weights and ``pos_weight``), so the final
    value continues the per-epoch ``val_loss`` curve.
    """
    network.eval()
    device = next(network.parameters()).device
    parts: list[tuple[torch.Tensor, ...]] = []
    loss_sum = 0.0
    for start in range(0, len(dataset), batch_size):
        images = dataset.images[start : start + batch_size].to(device).float().div_(255.0)
        occupancy = dataset.occupancy[start : start + batch_size].to(device)
        lead_gap = dataset.lead_gap[start : start + batch_size].to(device)
        logits, gap_pred = network(images)
        total, _, _ = perception_loss(
            logits,
            gap_pred,
            occupancy,
            lead_gap,
            lead_gap_weight=lead_gap_weight,
            smooth_l1_beta=smooth_l1_beta,
            cell_weights=cell_weights,
            pos_weight=pos_weight,
        )
        loss_sum += float(total) * len(images)
        parts.append((torch.sigmoid(logits).cpu(), occupancy.cpu(), gap_pred.cpu(), lead_gap.cpu()))
    prob, target, gap_pred, gap_target = (
        torch.cat([p[i] for p in parts]).numpy() for i in range(4)
    )
    scores = validation_scores(
        prob,
        target,
        gap_pred,
        gap_target,
        threshold=occupancy_threshold,
        max_range_m=network.spec.max_range_m,
    )
    return {VAL_LOSS: loss_sum / len(dataset), **scores}
