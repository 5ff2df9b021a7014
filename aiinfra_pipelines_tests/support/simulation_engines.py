"""Real ONNX engines for simulation tests, run through onnxruntime like any shipped engine.

``perception_net_onnx`` is the production network architecture (untrained, seeded). The others
are tiny graphs with the same inputs and outputs whose behaviour is known in advance, so a test
can say what *must* happen in closed loop:

* ``brightness_onnx`` is confident ("road free, no lead") on bright frames and reports 0.5
  everywhere — zero confidence — on dark ones (night, dense fog at night). Below the planner's
  confidence floor that must trigger the fallback.
* ``reckless_onnx`` (threshold 0) is always confident that the road is free: it never brakes,
  which in traffic ends in a collision that a cautious engine avoids.
"""

from __future__ import annotations

import torch
from torch import nn

from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.perception.onnx_export import export_onnx


class BrightnessNet(nn.Module):
    """Occupancy logit ``-gain * relu(mean brightness - threshold)`` in every cell; gap = range."""

    def __init__(self, spec: PerceptionSpec, threshold: float, gain: float = 80.0) -> None:
        super().__init__()
        self.spec = spec
        self.threshold = threshold
        self.gain = gain
        self.register_buffer("cells", torch.ones(1, 3, spec.bins))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        brightness = image.mean(dim=(1, 2, 3))
        logit = -self.gain * torch.relu(brightness - self.threshold)
        occupancy = logit.view(-1, 1, 1) * self.cells
        lead_gap = (brightness * 0.0 + 1.0).view(-1, 1)
        return occupancy, lead_gap


def brightness_onnx(threshold: float = 0.3) -> bytes:
    return export_onnx(BrightnessNet(perception_spec(), threshold))


def reckless_onnx() -> bytes:
    return export_onnx(BrightnessNet(perception_spec(), threshold=-1.0))


def perception_net_onnx(seed: int = 1) -> bytes:
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return export_onnx(PerceptionNet(perception_spec()).eval())
    finally:
        torch.random.set_rng_state(generator_state)
