"""The perception network: a small CNN that reads the front camera frame.

Small on purpose: it must train to a useful accuracy on 2 CPU cores in minutes, export cleanly
to ONNX (only Conv/BatchNorm/ReLU/Gemm — every runtime and quantizer supports them) and run
on the car well inside the latency budget.
"""

from __future__ import annotations

import torch
from torch import nn

from .contract import LANES, PerceptionSpec

# Stride-2 blocks: the feature map is the image downsampled 2**STAGES times per axis.
STAGES = 4


def _block(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def feature_map_size(spec: PerceptionSpec) -> tuple[int, int]:
    """(rows, columns) of the last block's output for the contract's image size."""
    rows, columns = spec.image_height, spec.image_width
    for _ in range(STAGES):  # kernel 3, stride 2, padding 1: ceil(n / 2)
        rows, columns = (rows - 1) // 2 + 1, (columns - 1) // 2 + 1
    return rows, columns


class PerceptionNet(nn.Module):
    """Image (N x 3 x H x W, [0,1]) → (occupancy logits N x 3 x bins, lead gap N x 1 in [0,1]).

    ``pool`` averages the last feature map down to (rows, columns) before the shared trunk;
    ``None`` keeps the whole map (4 x 10 cells of 16 x 16 px for the 64 x 160 camera). The
    occupancy grid and the lead gap are *where* questions — which lane, how far ahead — so a
    trunk that sees every cell's position localizes cars far better than one that sees a
    2 x 5 average, for a larger first linear layer but no more convolution work.
    """

    def __init__(
        self,
        spec: PerceptionSpec,
        width: int = 32,
        hidden: int = 128,
        pool: tuple[int, int] | None = (2, 5),
    ) -> None:
        super().__init__()
        self.spec = spec
        self.features = nn.Sequential(
            _block(3, width // 2),
            _block(width // 2, width),
            _block(width, width * 2),
            _block(width * 2, width * 2),
        )
        if pool is None:
            self.pool: nn.Module = nn.Identity()
            rows, columns = feature_map_size(spec)
        else:
            rows, columns = (int(pool[0]), int(pool[1]))
            self.pool = nn.AdaptiveAvgPool2d((rows, columns))
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Linear(width * 2 * rows * columns, hidden), nn.ReLU(inplace=True)
        )
        self.occupancy_head = nn.Linear(hidden, LANES * spec.bins)
        self.lead_gap_head = nn.Linear(hidden, 1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(self.pool(self.features(image)))
        occupancy = self.occupancy_head(hidden).view(-1, LANES, self.spec.bins)
        lead_gap = torch.sigmoid(self.lead_gap_head(hidden))
        return occupancy, lead_gap
