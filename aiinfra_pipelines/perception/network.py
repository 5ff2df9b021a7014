"""The perception network: a small CNN that reads the front camera frame.

Small on purpose: it must train to a useful accuracy on 2 CPU cores in minutes, export cleanly
to ONNX (only Conv/BatchNorm/ReLU/Gemm — every runtime and quantizer supports them) and run
on the car well inside the latency budget.
"""

from __future__ import annotations

import torch
from torch import nn

from .contract import LANES, PerceptionSpec


def _block(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


class PerceptionNet(nn.Module):
    """Image (N x 3 x H x W, [0,1]) → (occupancy logits N x 3 x bins, lead gap N x 1 in [0,1])."""

    def __init__(self, spec: PerceptionSpec, width: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.spec = spec
        self.features = nn.Sequential(
            _block(3, width // 2),
            _block(width // 2, width),
            _block(width, width * 2),
            _block(width * 2, width * 2),
        )
        self.pool = nn.AdaptiveAvgPool2d((2, 5))
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Linear(width * 2 * 10, hidden), nn.ReLU(inplace=True)
        )
        self.occupancy_head = nn.Linear(hidden, LANES * spec.bins)
        self.lead_gap_head = nn.Linear(hidden, 1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(self.pool(self.features(image)))
        occupancy = self.occupancy_head(hidden).view(-1, LANES, self.spec.bins)
        lead_gap = torch.sigmoid(self.lead_gap_head(hidden))
        return occupancy, lead_gap
