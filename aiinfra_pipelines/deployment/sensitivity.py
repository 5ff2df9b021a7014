"""Per-node quantization sensitivity: which layer hurts most when it alone runs in INT8.

Each candidate node is quantized *alone* (every other node stays FP32, same calibration
ranges) and compared with FP32 on the calibration frames. Isolating the node measures the
damage it causes itself; in a fully quantized model the last layers always look worst because
they inherit every earlier layer's noise. Two views are recorded, ``deployment.yaml``
``sensitivity.metric`` picks the one that ranks:

- ``output_sqnr_db``: SQNR of the model outputs (worst of occupancy logits and lead gap) —
  what the node does to the result the planner sees;
- ``layer_sqnr_db``: SQNR of the node's own output tensor — how badly the node quantizes.

Both are taken in the worst frame group (slice or condition aggregate, ``groups``), not over
all frames at once: the budget is per slice, and a node that wrecks the dark night frames can
look harmless averaged with bright day frames. Lower SQNR = more sensitive. Ties keep graph
order, so the ranking is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from aiinfra_pipelines.perception.contract import LEAD_GAP_OUTPUT, OCCUPANCY_OUTPUT

from .layerwise import run_tensors, sqnr_db
from .quantize import QuantizableNode, QuantizationWorkspace

OUTPUTS: tuple[str, ...] = (OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT)


@dataclass(frozen=True)
class NodeSensitivity:
    node: str
    op_type: str
    output_sqnr_db: float
    layer_sqnr_db: float | None
    score: float  # the ranking metric's value (lower = more sensitive)
    rank: int = 0

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def worst_group_sqnr(
    reference: np.ndarray, approximation: np.ndarray, groups: Mapping[str, np.ndarray]
) -> float:
    """The lowest SQNR over the frame groups (rows of the arrays selected by each mask)."""
    return min(sqnr_db(reference[mask], approximation[mask]) for mask in groups.values())


def rank_sensitivity(
    workspace: QuantizationWorkspace,
    nodes: Sequence[QuantizableNode],
    inputs: np.ndarray,
    metric: str = "output_sqnr_db",
    groups: Mapping[str, np.ndarray] | None = None,
) -> list[NodeSensitivity]:
    """Sensitivity of every node in ``nodes`` on ``inputs``, most sensitive first.

    ``groups`` maps a group name to a boolean mask over ``inputs`` (default: all frames as one
    group); a node is scored by its worst group.
    """
    if metric not in ("output_sqnr_db", "layer_sqnr_db"):
        raise ValueError(f"unknown sensitivity metric {metric!r}")
    groups = {name: mask for name, mask in (groups or {}).items() if mask.any()}
    groups = groups or {"all": np.ones(len(inputs), dtype=bool)}
    reference = run_tensors(workspace.fp32_onnx, list(OUTPUTS), inputs)
    reference.update(run_tensors(workspace.fp32_onnx, [node.output for node in nodes], inputs))
    measured: list[tuple[float, int, NodeSensitivity]] = []
    for order, node in enumerate(nodes):
        isolated = workspace.quantize(only=[node.name])
        # Outputs from the graph as it ships: exposing an inner tensor can stop onnxruntime
        # from fusing Q/DQ into its integer kernels, and those kernels are where INT8 breaks
        # (e.g. u8s8 saturation on CPUs without VNNI), so the layer view is a second run.
        values = run_tensors(isolated, list(OUTPUTS), inputs)
        output = min(worst_group_sqnr(reference[name], values[name], groups) for name in OUTPUTS)
        produced = {o for n in onnx.load_from_string(isolated).graph.node for o in n.output}
        layer = None
        if node.output in produced:
            layer_values = run_tensors(isolated, [node.output], inputs)[node.output]
            layer = worst_group_sqnr(reference[node.output], layer_values, groups)
        score = output if metric == "output_sqnr_db" or layer is None else layer
        measured.append(
            (score, order, NodeSensitivity(node.name, node.op_type, output, layer, score))
        )
    measured.sort(key=lambda item: (item[0], item[1]))
    return [
        NodeSensitivity(**{**asdict(entry), "rank": rank})
        for rank, (_, _, entry) in enumerate(measured, start=1)
    ]
