"""Fixtures for the mining tests: the real perception spec, real fleet frames, model zero."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.mining.settings import MINING_CONFIG_FILE
from aiinfra_pipelines.perception.contract import PerceptionSpec, perception_spec
from aiinfra_pipelines.perception.engine import Predictions


@pytest.fixture(scope="session")
def spec() -> PerceptionSpec:
    return perception_spec()


@pytest.fixture
def config() -> dict[str, Any]:
    """A private copy of mining.yaml that a test may edit."""
    return copy.deepcopy(load_resource_yaml(MINING_CONFIG_FILE))


@pytest.fixture(scope="module")
def fleet() -> pd.DataFrame:
    """Two highway-env vehicles, one episode: 5 logs, 109 real frames (cached per process)."""
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    return fleet_frames(2, 1, 0)


@pytest.fixture(scope="session")
def bootstrap_onnx(spec: PerceptionSpec) -> bytes:
    from aiinfra_pipelines.perception.onnx_export import bootstrap_network, export_onnx

    return export_onnx(bootstrap_network(spec))


class InferOnlyEngine:
    """Wraps an engine exposing only the ``Engine`` protocol (like a TensorRT backend), counting
    ``infer`` calls and frames; may present another SHA."""

    def __init__(self, inner: Any, sha256: str | None = None) -> None:
        self.inner = inner
        self.name = f"counting-{inner.name}"
        self.sha256 = sha256 or inner.sha256
        self.batch_size = inner.batch_size
        self.calls = 0
        self.frames = 0
        self.largest_call = 0

    def _count(self, n: int) -> None:
        self.calls += 1
        self.frames += n
        self.largest_call = max(self.largest_call, n)

    def infer(self, images: np.ndarray) -> Predictions:
        self._count(len(images))
        return self.inner.infer(images)


class CountingEngine(InferOnlyEngine):
    """Also exposes ``run_raw`` (as the onnxruntime engine does), counting each call."""

    def run_raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._count(len(batch))
        return self.inner.run_raw(batch)
