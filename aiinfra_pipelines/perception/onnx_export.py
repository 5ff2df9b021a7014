"""Export the perception network to ONNX with a dynamic batch dimension.

Lives with the contract (not in ``deployment/``) because the bootstrap engine — the network
before any release — must be exportable by mining, which runs before training exists.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from .contract import (
    EMBEDDING_OUTPUT,
    INPUT_NAME,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    ONNX_OPSET,
)
from .network import PerceptionNet, embedding_as_output

OPSET = ONNX_OPSET


def export_onnx(net: PerceptionNet, opset: int = OPSET) -> bytes:
    """Serialize ``net`` (eval mode, CPU) to ONNX bytes; identical weights give identical bytes.

    The graph has three outputs: the contract's occupancy logits and lead gap, and the
    penultimate features (``EMBEDDING_OUTPUT``, N x ``net.embedding_dim``) that frame
    similarity indexes, so mining gets both from one run. Exported under
    :func:`embedding_as_output` (hooks, removed afterwards), leaving the network's own
    two-output ``forward`` as training uses it. A module without a trunk (a hand-built test
    engine) exports the two contract outputs only, like an engine from before embeddings.
    """
    net = net.eval().cpu()
    example = torch.zeros(1, 3, net.spec.image_height, net.spec.image_width)
    outputs = [OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT]
    hooks: contextlib.AbstractContextManager = contextlib.nullcontext()
    if isinstance(getattr(net, "trunk", None), torch.nn.Module):
        outputs.append(EMBEDDING_OUTPUT)
        hooks = embedding_as_output(net)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), hooks:
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            net,
            (example,),
            buffer,
            input_names=[INPUT_NAME],
            output_names=outputs,
            dynamic_axes={INPUT_NAME: {0: "batch"}, **{name: {0: "batch"} for name in outputs}},
            opset_version=opset,
            dynamo=False,
        )
    return buffer.getvalue()


def bootstrap_network(spec, seed: int = 0) -> PerceptionNet:
    """Model zero: the network as initialized under a fixed seed, before any training.

    Before the first release there is no learned engine; mining runs this one, whose near-coin-
    flip confidence marks every frame as a candidate — exactly right when nothing is known yet.
    """
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return PerceptionNet(spec).eval()
    finally:
        torch.random.set_rng_state(generator_state)
