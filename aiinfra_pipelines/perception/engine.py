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
    EMBEDDING_OUTPUT,
    INPUT_NAME,
    LEAD_GAP_OUTPUT,
    OCCUPANCY_OUTPUT,
    PerceptionSpec,
    confidence_from_probabilities,
    images_to_input,
    input_to_images,
    session_takes_camera_bytes,
    sigmoid,
)


@dataclass(frozen=True)
class Predictions:
    occupancy: np.ndarray  # N x 3 x bins, probabilities
    lead_gap_m: np.ndarray  # N
    confidence: np.ndarray  # N, 0..1


class EmbeddingUnavailableError(RuntimeError):
    """The engine's graph has no ``embedding`` output (exported before embeddings existed)."""

    def __init__(self, engine_name: str, sha256: str) -> None:
        super().__init__(
            f"engine {engine_name!r} (sha256 {sha256[:12]}) has no {EMBEDDING_OUTPUT!r} output: "
            "it was exported before engines carried embeddings; re-export it (any release "
            "after this change does) to get frame embeddings"
        )
        self.engine_name = engine_name
        self.sha256 = sha256


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
        self._start_session()

    def _start_session(self) -> None:
        self._session = self._build_session()
        # Read once per session, not per inference: it sits on the batch-1 latency path.
        self._camera_bytes = session_takes_camera_bytes(self._session)

    @property
    def takes_camera_bytes(self) -> bool:
        """Whether the graph takes the camera's uint8 N x H x W x 3 frames (an INT8 engine
        with camera input, deployment.camera_input) rather than float32 N x 3 x H x W."""
        return self._camera_bytes

    def prepare(self, images: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x 3 frames → what this graph's input takes."""
        if not self.takes_camera_bytes:
            return images_to_input(images)
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(
                f"expected uint8 N x H x W x 3 images, got {images.dtype} {images.shape}"
            )
        return np.ascontiguousarray(images)

    def _feed(self, batch: np.ndarray) -> np.ndarray:
        """``batch`` as the graph takes it: float inputs become camera bytes again (exactly)
        for a camera-input graph, so ``run_raw`` callers holding network inputs keep working."""
        if self.takes_camera_bytes and batch.dtype != np.uint8:
            return input_to_images(batch)
        return batch

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
        self._start_session()

    @property
    def has_embedding(self) -> bool:
        """Whether the graph carries the ``embedding`` output (old engines do not)."""
        return EMBEDDING_OUTPUT in self._output_names()

    @property
    def embedding_dim(self) -> int | None:
        """Width D of the embedding, or None without one (or with a symbolic width)."""
        for output in self._session.get_outputs():
            if output.name == EMBEDDING_OUTPUT:
                width = output.shape[-1]
                return int(width) if isinstance(width, int) else None
        return None

    def _output_names(self) -> set[str]:
        return {output.name for output in self._session.get_outputs()}

    def run_raw(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(occupancy logits, lead gap) of float32 N x 3 x H x W inputs, or of what
        :meth:`prepare` returns (camera bytes, for a camera-input graph)."""
        occupancy, lead_gap = self._session.run(
            [OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT], {INPUT_NAME: self._feed(batch)}
        )
        return occupancy, lead_gap

    def run_raw_with_embedding(
        self, batch: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(occupancy logits, lead gap, embedding N x D or None) from one session run.

        None when the graph has no embedding output: the predictions still come back, so
        engines already deployed keep working and callers report the embeddings missing.
        """
        if not self.has_embedding:
            return (*self.run_raw(batch), None)
        occupancy, lead_gap, embedding = self._session.run(
            [OCCUPANCY_OUTPUT, LEAD_GAP_OUTPUT, EMBEDDING_OUTPUT], {INPUT_NAME: self._feed(batch)}
        )
        return occupancy, lead_gap, embedding.astype(np.float32, copy=False)

    def infer(self, images: np.ndarray) -> Predictions:
        return self.infer_with_embeddings(images, embeddings=False)[0]

    def infer_with_embeddings(
        self, images: np.ndarray, *, embeddings: bool = True
    ) -> tuple[Predictions, np.ndarray | None]:
        """Predictions and (when ``embeddings`` and the graph has them) N x D embeddings.

        One session run per batch for both; the embeddings are None for an engine without
        the output.
        """
        want = embeddings and self.has_embedding
        if len(images) == 0:
            empty = np.zeros((0, 3, self.spec.bins), dtype=np.float32)
            vectors = np.zeros((0, self.embedding_dim or 0), np.float32) if want else None
            return Predictions(empty, np.zeros(0, np.float32), np.zeros(0, np.float32)), vectors
        occupancy_parts, gap_parts, embedding_parts = [], [], []
        for start in range(0, len(images), self.batch_size):
            batch = self.prepare(images[start : start + self.batch_size])
            if want:
                occupancy, lead_gap, embedding = self.run_raw_with_embedding(batch)
                embedding_parts.append(embedding)
            else:
                occupancy, lead_gap = self.run_raw(batch)
            occupancy_parts.append(occupancy)
            gap_parts.append(lead_gap)
        predictions = outputs_to_predictions(
            np.concatenate(occupancy_parts), np.concatenate(gap_parts), self.spec
        )
        return predictions, (np.concatenate(embedding_parts) if want else None)

    def embed(self, images: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x 3 frames → float32 N x D embeddings.

        Raises :class:`EmbeddingUnavailableError` for an engine without the output.
        """
        if not self.has_embedding:
            raise EmbeddingUnavailableError(self.name, self.sha256)
        vectors = self.infer_with_embeddings(images)[1]
        assert vectors is not None  # has_embedding checked above
        return vectors
