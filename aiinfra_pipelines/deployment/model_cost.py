"""What a car-side network costs per frame: parameters and multiply-accumulates.

The car's compute budget (gates.yaml ``deployment.latency.<target>.max_macs_per_frame``) is
stated in multiply-accumulates of one frame as the car runs it, the one size figure that does
not move with the machine measuring it; pruning reports its steps in the same units.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from aiinfra_pipelines.perception.network import PerceptionNet


def count_parameters(net: nn.Module) -> int:
    """Trainable and learned parameters (BatchNorm running statistics are buffers, not counted)."""
    return int(sum(parameter.numel() for parameter in net.parameters()))


@torch.no_grad()
def count_macs(net: PerceptionNet) -> int:
    """Multiply-accumulates of one frame as the car runs it (eval mode: both views when
    ``mirror_average``), over every Conv2d and Linear, measured by forward hooks."""
    total = 0

    def conv_hook(module: nn.Conv2d, _inputs: Any, output: torch.Tensor) -> None:
        nonlocal total
        kernel = module.kernel_size[0] * module.kernel_size[1]
        total += output.numel() * (module.in_channels // module.groups) * kernel

    def linear_hook(module: nn.Linear, _inputs: Any, output: torch.Tensor) -> None:
        nonlocal total
        total += output.numel() * module.in_features

    handles = []
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(conv_hook))
        elif isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(linear_hook))
    was_training = net.training
    parameter = next(net.parameters())
    example = torch.zeros(
        1, 3, net.spec.image_height, net.spec.image_width, device=parameter.device
    )
    try:
        net.eval()(example)
    finally:
        for handle in handles:
            handle.remove()
        net.train(was_training)
    return int(total)
