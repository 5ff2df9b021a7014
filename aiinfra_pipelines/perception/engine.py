"""The engine interface the car (and every offline consumer) runs perception through.

An engine is an ONNX graph behind a runtime. Callers hand it camera frames as stored and get
probabilities, lead gaps in metres and a per-frame confidence back, so mining, simulation and
shadow mode never touch runtime specifics. onnxruntime on CPU is the default backend; other
backends (TensorRT) implement the same ``infer``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .contract import (
    INPUT_NAME,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    PerceptionSpec,
    confidence_from_probabilities,
    images_to_input,
    sigmoid,
)


@dataclass(frozen=True)
class Predictions:
    occupancy: np.ndarray  # N x 3 x bins, probabilities
    lead_gap_m: np.ndarray  # N
    confidence: np.ndarray  # N, 0..1


class Engine(Protocol):
    name: str
    sha256: str

    def infer(self, images: np.ndarray) -> Predictions: ...


def outputs_to_predictions(
    occupancy_logits: np.ndarray, lead_gap: np.ndarray, spec: PerceptionSpec
) -> Predictions:
    occupancy = sigmoid(occupancy_logits.astype(np.float64)).astype(np.float32)
    return Predictions(
        occupancy=occupancy,
        lead_gap_m=(lead_gap.reshape(-1) * spec.max_range_m).astype(np.float32),
        confidence=confidence_from_probabilities(occupancy).astype(np.float32),
    )


class OnnxRuntimeEngine:
    """An ONNX model on onnxruntime's CPU provider, run in fixed-size batches.

    Picklable, so a pool of worker processes (the fleet drives cars in parallel) can receive
    it: pickling sends the model bytes and the copy builds its own session. Workers must be
    spawned, not forked — onnxruntime's global thread pools do not survive ``fork``.
    """

    def __init__(
        self,
        onnx_bytes: bytes,
        spec: PerceptionSpec,
        *,
        name: str = "onnxruntime",
        batch_size: int = 64,
        intra_op_threads: int = 0,
    ) -> None:
        self._onnx_bytes = onnx_bytes
        self._intra_op_threads = intra_op_threads
        self.spec = spec
        self.name = name
        self.batch_size = batch_size
        self.sha256 = hashlib.sha256(onnx_bytes).hexdigest()
        self._session = self._build_session()

    def _build_session(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra_op_threads
        # Nodes one after another, never independent branches in parallel (onnxruntime's
        # default, pinned: certification requires bit-identical outputs run after run).
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        return ort.InferenceSession(
            self._onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_session"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._session = self._build_session()

    def run_raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        occupancy, lead_gap = self._session.run(
            [OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT], {INPUT_NAME: batch}
        )
        return occupancy, lead_gap

    def infer(self, images: np.ndarray) -> Predictions:
        if len(images) == 0:
            empty = np.zeros((0, 3, self.spec.bins), dtype=np.float32)
            return Predictions(empty, np.zeros(0, np.float32), np.zeros(0, np.float32))
        occupancy_parts, gap_parts = [], []
        for start in range(0, len(images), self.batch_size):
            occupancy, lead_gap = self.run_raw(
                images_to_input(images[start : start + self.batch_size])
            )
            occupancy_parts.append(occupancy)
            gap_parts.append(lead_gap)
        return outputs_to_predictions(
            np.concatenate(occupancy_parts), np.concatenate(gap_parts), self.spec
        )
