"""The pipeline inference path: chunked decoding must not change a single prediction."""

from __future__ import annotations

import numpy as np
import pytest

from aiinfra_pipelines.mining.engine_runner import (
    images_to_input_into,
    mining_engine,
    run_engine_over_frames,
)
from aiinfra_pipelines.perception.contract import decode_images, images_to_input
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

from .conftest import CountingEngine, InferOnlyEngine

BATCH = 16


@pytest.fixture(scope="module")
def one_shot(fleet, spec, bootstrap_onnx):
    """The reference: ``engine.infer`` on every frame at once."""
    engine = OnnxRuntimeEngine(bootstrap_onnx, spec, batch_size=BATCH)
    images = decode_images(fleet["image"].tolist(), spec.image_height, spec.image_width)
    return engine, engine.infer(images)


@pytest.mark.parametrize("wrapper", [CountingEngine, InferOnlyEngine])
@pytest.mark.parametrize("chunk_batches", [1, 3])
def test_chunked_run_equals_one_shot_infer(fleet, spec, one_shot, chunk_batches, wrapper):
    engine, reference = one_shot
    counting = wrapper(engine)
    chunked = run_engine_over_frames(counting, fleet, spec, chunk_batches=chunk_batches)
    np.testing.assert_array_equal(chunked.occupancy, reference.occupancy)
    np.testing.assert_array_equal(chunked.lead_gap_m, reference.lead_gap_m)
    np.testing.assert_array_equal(chunked.confidence, reference.confidence)
    assert counting.frames == len(fleet)
    # Memory bound: at most batch × chunk_batches frames are decoded at any time.
    chunk = BATCH * chunk_batches
    if wrapper is InferOnlyEngine:  # one infer call per decoded chunk
        assert counting.largest_call == chunk
        assert counting.calls == -(-len(fleet) // chunk)
    else:  # run_raw: one call per engine batch
        assert counting.largest_call == BATCH
        assert counting.calls == -(-len(fleet) // BATCH)


def test_one_pass_preprocessing_is_bit_identical_to_the_contract():
    images = np.arange(256, dtype=np.uint8).repeat(3 * 4).reshape(2, 32, 16, 3)[:, :, :, ::-1]
    images = np.ascontiguousarray(images)
    out = np.empty((2, 3, 32, 16), dtype=np.float32)
    np.testing.assert_array_equal(images_to_input_into(images, out), images_to_input(images))


def test_mining_engine_uses_configured_batch_and_an_engine_sha(spec, bootstrap_onnx, config):
    config["engine"]["batch_size"] = 8
    engine = mining_engine(bootstrap_onnx, spec, config)
    assert engine.batch_size == 8
    assert len(engine.sha256) == 64


def test_no_frames_give_empty_predictions(fleet, spec, bootstrap_onnx):
    engine = CountingEngine(OnnxRuntimeEngine(bootstrap_onnx, spec))
    predictions = run_engine_over_frames(engine, fleet.iloc[0:0], spec, chunk_batches=2)
    assert predictions.occupancy.shape == (0, 3, spec.bins)
    assert predictions.confidence.shape == (0,)
    assert engine.calls == 0


def test_frames_from_another_camera_are_refused(fleet, spec, bootstrap_onnx):
    engine = OnnxRuntimeEngine(bootstrap_onnx, spec)
    wrong = fleet.iloc[:3].assign(image_width=spec.image_width * 2)
    with pytest.raises(ValueError, match="image_width"):
        run_engine_over_frames(engine, wrong, spec, chunk_batches=1)
