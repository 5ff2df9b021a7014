"""An onnxruntime engine handed to worker processes (the fleet drives cars in a pool)."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np

from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import bootstrap_onnx
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

SPEC = perception_spec()


def _images(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (6, SPEC.image_height, SPEC.image_width, 3), dtype=np.uint8)


def _infer_in_child(engine: OnnxRuntimeEngine, images: np.ndarray, queue) -> None:
    queue.put(engine.infer(images).occupancy)


def test_a_spawned_worker_and_a_pickled_copy_predict_like_the_parent(dagster_home):
    engine = OnnxRuntimeEngine(bootstrap_onnx(SPEC), SPEC, name="zero", batch_size=4)
    images = _images()
    expected = engine.infer(images).occupancy

    context = multiprocessing.get_context("spawn")  # what the fleet's drive pool uses
    queue = context.Queue()
    child = context.Process(target=_infer_in_child, args=(engine, images, queue))
    child.start()
    in_worker = queue.get(timeout=120)
    child.join(timeout=60)

    assert child.exitcode == 0
    np.testing.assert_array_equal(in_worker, expected)
    copy = pickle.loads(pickle.dumps(engine))
    assert (copy.name, copy.sha256) == (engine.name, engine.sha256)
    np.testing.assert_array_equal(copy.infer(images).occupancy, expected)
