"""Frame embeddings: the exported engine's third output is the network's ``embed``.

Old engines (no embedding output) keep predicting; asking them for embeddings says why not.
"""

from __future__ import annotations

import numpy as np
import onnx
import pandas as pd
import pytest
import torch

from aiinfra_pipelines.deployment.export import check_graph
from aiinfra_pipelines.mining.engine_runner import (
    engine_has_embedding,
    perceive_frames,
    perceive_frames_with_embeddings,
)
from aiinfra_pipelines.perception.contract import (
    EMBEDDING_OUTPUT,
    images_to_input,
    perception_spec,
)
from aiinfra_pipelines.perception.engine import EmbeddingUnavailableError, OnnxRuntimeEngine
from aiinfra_pipelines.perception.network import PerceptionNet
from aiinfra_pipelines.perception.onnx_export import export_onnx

SPEC = perception_spec()


def _images(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (count, SPEC.image_height, SPEC.image_width, 3)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def _network(mirror_average: bool) -> PerceptionNet:
    torch.manual_seed(3)
    return PerceptionNet(SPEC, hidden=48, mirror_average=mirror_average).eval()


def _without_embedding(onnx_bytes: bytes) -> bytes:
    """The same graph as an engine exported before embeddings existed: two outputs."""
    model = onnx.load_from_string(onnx_bytes)
    kept = [output for output in model.graph.output if output.name != EMBEDDING_OUTPUT]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model.SerializeToString()


@pytest.mark.parametrize("mirror_average", [False, True])
def test_exported_embedding_matches_torch_embed(mirror_average):
    net = _network(mirror_average)
    onnx_bytes = export_onnx(net)
    model = check_graph(onnx_bytes)
    output = {value.name: value for value in model.graph.output}[EMBEDDING_OUTPUT]
    dims = output.type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_value == net.embedding_dim == 48

    images = _images(7)
    engine = OnnxRuntimeEngine(onnx_bytes, SPEC, batch_size=3)  # 3 + 3 + 1: batch is dynamic
    predictions, vectors = engine.infer_with_embeddings(images)
    with torch.inference_mode():
        inputs = torch.from_numpy(images_to_input(images))
        want = net.embed(inputs).numpy()
        occupancy, _ = net(inputs)
    assert engine.has_embedding and engine.embedding_dim == 48
    assert vectors.dtype == np.float32 and vectors.shape == (7, 48)
    np.testing.assert_allclose(vectors, want, atol=1e-5)
    np.testing.assert_allclose(engine.embed(images), vectors)
    # The same session run's predictions are the plain ``infer``'s, bit for bit.
    assert np.array_equal(predictions.occupancy, engine.infer(images).occupancy)
    np.testing.assert_allclose(
        predictions.occupancy, 1 / (1 + np.exp(-occupancy.numpy())), atol=1e-5
    )


def test_mirror_average_embeds_a_frame_and_its_mirror_alike():
    net = _network(mirror_average=True)
    inputs = torch.from_numpy(images_to_input(_images(2, seed=1)))
    with torch.inference_mode():
        torch.testing.assert_close(net.embed(inputs), net.embed(inputs.flip(-2)))
        single = _network(mirror_average=False)
        assert not torch.allclose(single.embed(inputs), single.embed(inputs.flip(-2)))


def test_export_leaves_the_networks_two_output_forward_as_it_was():
    net = _network(mirror_average=True)
    inputs = torch.from_numpy(images_to_input(_images(3, seed=2)))
    with torch.no_grad():
        before = net(inputs)
        export_onnx(net)
        after = net.train()(inputs)  # training mode too: the export left no hook behind
    assert len(before) == len(after) == 2
    assert not net._forward_hooks and not net.trunk._forward_hooks
    assert after[0].shape == (3, 3, SPEC.bins) and after[1].shape == (3, 1)


def test_an_engine_without_the_output_predicts_and_reports_embeddings_missing():
    old = OnnxRuntimeEngine(_without_embedding(export_onnx(_network(False))), SPEC, batch_size=4)
    images = _images(5, seed=4)
    predictions, vectors = old.infer_with_embeddings(images)
    assert not old.has_embedding and old.embedding_dim is None
    assert vectors is None and predictions.occupancy.shape == (5, 3, SPEC.bins)
    with pytest.raises(EmbeddingUnavailableError, match="no 'embedding' output"):
        old.embed(images)


class _OneRunOnly(OnnxRuntimeEngine):
    """Refuses the predictions-only run: embeddings must come from the prediction run itself."""

    def run_raw(self, batch):
        raise AssertionError("a second, predictions-only session run")


def _frames_table(images: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "log_id": "log-e",
            "frame_index": np.arange(len(images)),
            "image": [image.tobytes() for image in images],
            "image_height": SPEC.image_height,
            "image_width": SPEC.image_width,
            "lane_index": 1,
            "lane_count": 3,
        }
    )


def test_mining_gets_embeddings_from_the_same_run_as_its_predictions():
    onnx_bytes = export_onnx(_network(False))
    images = _images(11, seed=6)
    frames = _frames_table(images)
    predictions, vectors = perceive_frames_with_embeddings(
        _OneRunOnly(onnx_bytes, SPEC, batch_size=4), frames, SPEC
    )
    plain = OnnxRuntimeEngine(onnx_bytes, SPEC, batch_size=4)
    assert np.array_equal(predictions.occupancy, perceive_frames(plain, frames, SPEC).occupancy)
    np.testing.assert_allclose(vectors, plain.embed(images), atol=1e-6)

    old = OnnxRuntimeEngine(_without_embedding(onnx_bytes), SPEC, batch_size=4)
    old_predictions, missing = perceive_frames_with_embeddings(old, frames, SPEC)
    assert missing is None and not engine_has_embedding(old)
    assert np.array_equal(old_predictions.occupancy, predictions.occupancy)
