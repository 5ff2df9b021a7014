"""ONNX export: valid graph, dynamic batch, numerically equal to PyTorch, or a clear refusal."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
import torch

from aiinfra_pipelines.deployment.export import (
    ExportParityError,
    OnnxExportError,
    export_checked_onnx,
    onnx_outputs,
    torch_outputs,
)
from aiinfra_pipelines.perception.contract import INPUT_NAME, perception_spec
from aiinfra_pipelines.perception.network import PerceptionNet


def test_export_is_checker_clean_batch_dynamic_and_equal_to_pytorch(exported, network, held_out):
    model = onnx.load_from_string(exported.onnx_bytes)
    onnx.checker.check_model(model, full_check=True)
    (image,) = [i for i in model.graph.input if i.name == INPUT_NAME]
    assert image.type.tensor_type.shape.dim[0].dim_param  # symbolic batch axis
    assert exported.sha256 == hashlib.sha256(exported.onnx_bytes).hexdigest()
    assert set(exported.max_abs_error) == {"occupancy_logits", "lead_gap"}
    assert max(exported.max_abs_error.values()) <= 1e-4
    # On frames the export never saw, at a batch size it was never run with.
    inputs = held_out.inputs()[:7]
    reference = torch_outputs(network, inputs)
    for name, values in onnx_outputs(exported.onnx_bytes, inputs, batch=7).items():
        np.testing.assert_allclose(values, reference[name], atol=1e-4)


def test_the_same_weights_export_to_the_same_bytes(network, calibration, exported):
    again = export_checked_onnx(network, calibration.head(8).inputs(), tolerance=1e-4, opset=17)
    assert again.sha256 == exported.sha256


class _BesselHead(PerceptionNet):
    """A lead-gap head through an op ONNX has no equivalent for."""

    def forward(self, image):
        occupancy, lead_gap = super().forward(image)
        return occupancy, torch.special.bessel_j0(lead_gap)


def test_an_unsupported_operator_fails_the_export_naming_the_operator(calibration):
    with pytest.raises(OnnxExportError, match="aten::special_bessel_j0") as failure:
        export_checked_onnx(
            _BesselHead(perception_spec()).eval(),
            calibration.head(4).inputs(),
            tolerance=1e-4,
            opset=17,
        )
    assert failure.value.operator == "aten::special_bessel_j0"


class _BatchFrozenNet(PerceptionNet):
    """Python control flow on the batch size: the tracer freezes the batch-1 branch."""

    def forward(self, image):
        occupancy, lead_gap = super().forward(image)
        if image.shape[0] == 1:
            return occupancy, lead_gap
        return occupancy, lead_gap * 0.5


def test_a_graph_that_computes_something_else_than_pytorch_is_refused(calibration):
    torch.manual_seed(0)
    with pytest.raises(ExportParityError, match="lead_gap max"):
        export_checked_onnx(
            _BatchFrozenNet(perception_spec()).eval(),
            calibration.head(8).inputs(),
            tolerance=1e-4,
            opset=17,
        )
