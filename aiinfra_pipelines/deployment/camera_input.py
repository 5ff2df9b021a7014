"""INT8 engines that take the camera's bytes: the input quantization is the camera's own.

A camera delivers uint8 frames; the network is exported for float32 N x 3 x H x W in [0, 1]
(``contract.images_to_input``), and the INT8 graph's first QuantizeLinear turns that float
back into unsigned bytes. With that quantization pinned to scale 1/255 and zero point 0
(:func:`input_quant_overrides`), the bytes it produces are exactly the camera's. So the graph
can take the frames as they are: its float input and first QuantizeLinear are replaced by a
transpose of the uint8 N x H x W x 3 frames into the N x 3 x H x W layout the first convolution
reads, which onnxruntime then folds into its own channels-last layout.

Measured on the width-16 network at the serving batch (benchmarks/engines.py): the float
conversion (in Python), the QuantizeLinear and the two input transposes were about a third of
the INT8 engine's time; without them INT8 runs at about 2.1x FP32's throughput instead of
1.2-1.4x, with bit-identical outputs. :func:`with_camera_input` checks that identity on real
frames every time it rewrites a graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aiinfra_pipelines.perception.contract import INPUT_NAME, images_to_input

# The camera's quantization of a normalized frame: value k / 255 is stored as byte k.
CAMERA_SCALE = np.float32(1.0 / 255.0)
CAMERA_ZERO_POINT = np.uint8(0)
TRANSPOSE_NODE = "camera_input_nhwc_to_nchw"


class CameraInputError(RuntimeError):
    """A rewritten graph does not give the outputs of the graph it replaces."""


@dataclass(frozen=True)
class CameraInputGraph:
    """The engine bytes after the rewrite (or unchanged), and why."""

    onnx_bytes: bytes
    applied: bool
    note: str

    def to_dict(self) -> dict[str, object]:
        return {"applied": self.applied, "note": self.note}


def input_quant_overrides() -> dict[str, list[dict[str, object]]]:
    """onnxruntime ``TensorQuantOverrides`` that pin the input's quantization to the camera's."""
    return {
        INPUT_NAME: [{"scale": np.array(CAMERA_SCALE), "zero_point": np.array(CAMERA_ZERO_POINT)}]
    }


def takes_camera_bytes(model: onnx.ModelProto) -> bool:
    """Whether the graph's input is the camera's uint8 frames (else normalized float32)."""
    return model.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8


def _input_quantize(model: onnx.ModelProto) -> tuple[onnx.NodeProto | None, str]:
    """The QuantizeLinear that alone reads the float input, or None and why the graph has none
    the camera's bytes can replace."""
    graph = model.graph
    readers = [node for node in graph.node if INPUT_NAME in node.input]
    if len(readers) != 1 or readers[0].op_type != "QuantizeLinear":
        kinds = [node.op_type for node in readers]
        return None, f"the input is read by {kinds}, not by one QuantizeLinear"
    quantize = readers[0]
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    scale = constants.get(quantize.input[1])
    zero_point = constants.get(quantize.input[2]) if len(quantize.input) > 2 else None
    if scale is None or zero_point is None:
        return None, "the input QuantizeLinear's scale or zero point is not a constant"
    if zero_point.dtype != np.uint8 or scale.size != 1 or zero_point.size != 1:
        return None, f"the input is quantized to {zero_point.dtype}, not to unsigned bytes"
    if np.float32(scale.item()) != CAMERA_SCALE or int(zero_point.item()) != 0:
        return None, (
            f"the input quantization is scale {float(scale.item()):.6g}, zero point "
            f"{int(zero_point.item())}, not the camera's 1/255 and 0"
        )
    return quantize, ""


def rewrite_for_camera_input(int8_onnx: bytes) -> tuple[bytes | None, str]:
    """The graph taking uint8 N x H x W x 3 under the same input name, or None and why not."""
    model = onnx.load_from_string(int8_onnx)
    if takes_camera_bytes(model):
        return int8_onnx, "already takes camera bytes"
    quantize, reason = _input_quantize(model)
    if quantize is None:
        return None, reason
    graph = model.graph
    old_input = graph.input[0]
    dims = old_input.type.tensor_type.shape.dim
    if len(dims) != 4:
        return None, f"the input has {len(dims)} dimensions, not N x 3 x H x W"
    batch, channels, height, width = (dim.dim_param or dim.dim_value for dim in dims)
    camera = helper.make_tensor_value_info(
        INPUT_NAME, TensorProto.UINT8, [batch, height, width, channels]
    )
    transpose = helper.make_node(
        "Transpose", [INPUT_NAME], [quantize.output[0]], perm=[0, 3, 1, 2], name=TRANSPOSE_NODE
    )
    position = list(graph.node).index(quantize)
    graph.node.remove(quantize)
    graph.node.insert(position, transpose)
    graph.input.remove(old_input)
    graph.input.insert(0, camera)
    unused = {name for name in quantize.input[1:] if not any(name in n.input for n in graph.node)}
    for initializer in [init for init in graph.initializer if init.name in unused]:
        graph.initializer.remove(initializer)
    onnx.checker.check_model(model)
    return model.SerializeToString(), "input quantization folded into the camera's bytes"


def with_camera_input(int8_onnx: bytes, images: np.ndarray) -> CameraInputGraph:
    """``int8_onnx`` rewritten to take camera bytes when its input quantization allows, checked
    to give bit-identical outputs on ``images`` (uint8 N x H x W x 3); unchanged otherwise.

    Raises :class:`CameraInputError` when the rewrite changes any output: that would be a bug
    in the rewrite, never a reason to ship the float-input graph silently.
    """
    rewritten, note = rewrite_for_camera_input(int8_onnx)
    if rewritten is None:
        return CameraInputGraph(int8_onnx, applied=False, note=note)
    if rewritten is int8_onnx:
        return CameraInputGraph(int8_onnx, applied=True, note=note)
    require_same_outputs(int8_onnx, rewritten, images)
    return CameraInputGraph(rewritten, applied=True, note=f"{note}; outputs bit-identical")


def require_same_outputs(float_input: bytes, camera_input: bytes, images: np.ndarray) -> None:
    """Raise :class:`CameraInputError` unless the camera-input graph gives every output of the
    float-input graph bit for bit on ``images`` (uint8 N x H x W x 3)."""
    before = _run(float_input, images_to_input(images))
    after = _run(camera_input, np.ascontiguousarray(images))
    for name, expected in before.items():
        if not np.array_equal(expected, after[name]):
            worst = float(np.abs(expected.astype(np.float64) - after[name]).max())
            raise CameraInputError(
                f"camera-input INT8 graph differs from the graph it replaces on output {name!r} "
                f"(max |difference| {worst:.3g} over {len(images)} frames)"
            )


def _run(onnx_bytes: bytes, feed: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, {INPUT_NAME: feed}), strict=True))
