"""Exact nearest-neighbour search over one engine's frame embeddings (faiss, cosine).

Vectors are L2-normalized and kept in a ``faiss.IndexFlatIP``: the inner product of unit
vectors is their cosine similarity, and the distance reported is ``1 - cosine`` (0: the same
direction). Flat, not approximate: the fleet's frames number in the millions at most, where an
exact scan of D=128 vectors takes milliseconds and a "more like this" answer never depends on
an ANN index's recall.

One index holds one engine's embeddings only (``engine_sha``): two engines' penultimate
features live in unrelated spaces, so a vector of one is never compared with the other's. Row
``i`` of the faiss index is row ``i`` of ``keys`` (log, frame, upload batch); batches are added
whole, in order, so an index grows by appending what mining published since.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .embeddings import embedding_matrix

KEY_COLUMNS: tuple[str, ...] = ("log_id", "frame_index", "batch")
METRIC = "cosine"
# Distances are rounded for ordering and display: float32 noise must not reorder exact ties.
DISTANCE_DECIMALS = 6


class UnknownFrameError(KeyError):
    """The frame is not in the index (never ingested, not yet mined, or another engine's)."""

    def __str__(self) -> str:
        return str(self.args[0])


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32, contiguous); an all-zero row stays zero."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.where(norms > 0, norms, 1.0), dtype=np.float32)


def _flat_index(dim: int) -> Any:
    import faiss

    return faiss.IndexFlatIP(dim)


@dataclass
class FrameIndex:
    """One engine's frame embeddings, searchable by frame."""

    engine_sha: str
    dim: int
    index: Any = None  # faiss.IndexFlatIP
    keys: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(KEY_COLUMNS)))
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    metric: str = METRIC

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = _flat_index(self.dim)
        self._positions: dict[tuple[str, int], int] | None = None

    @property
    def rows(self) -> int:
        return int(self.index.ntotal)

    def add_batch(self, batch: str, checksum: str, table: pd.DataFrame) -> int:
        """Append ``batch``'s rows of this index's engine; returns how many were added.

        Rows of other engines are left out (and counted in the batch record), never mixed in.
        """
        ours = table[table["engine_sha"] == self.engine_sha].reset_index(drop=True)
        if len(ours):
            vectors = embedding_matrix(ours)
            if vectors.shape[1] != self.dim:
                raise ValueError(
                    f"batch {batch}: embeddings have width {vectors.shape[1]}, the index {self.dim}"
                )
            added = ours.assign(batch=batch)[list(KEY_COLUMNS)]
            keys = pd.concat([self.keys, added], ignore_index=True) if len(self.keys) else added
            self.index.add(unit_rows(vectors))
            self.keys = keys.astype({"log_id": str, "frame_index": "int64", "batch": str})
            self._positions = None
        self.batches[batch] = {
            "checksum": checksum,
            "rows": len(ours),
            "other_engine_rows": len(table) - len(ours),
        }
        return len(ours)

    def position(self, log_id: str, frame_index: int) -> int:
        if self._positions is None:
            self._positions = {
                (str(log), int(frame)): row
                for row, (log, frame) in enumerate(
                    zip(self.keys["log_id"], self.keys["frame_index"], strict=True)
                )
            }
        try:
            return self._positions[(str(log_id), int(frame_index))]
        except KeyError:
            raise UnknownFrameError(
                f"frame {log_id}:{frame_index} is not in the similarity index ({self.rows} frames "
                f"of engine {self.engine_sha[:12]}): unknown log or frame, not mined yet, or "
                "embedded by another engine"
            ) from None

    def search(self, log_id: str, frame_index: int, k: int) -> pd.DataFrame:
        """The ``k`` frames nearest ``log_id:frame_index`` (itself first), nearest first.

        Columns: ``rank`` (1-based), ``log_id``, ``frame_index``, ``batch``, ``distance``.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        row = self.position(log_id, frame_index)
        query = np.asarray(self.index.reconstruct(row), dtype=np.float32)[None, :]
        similarity, ids = self.index.search(query, min(k, self.rows))
        found = ids[0] >= 0
        hits = self.keys.iloc[ids[0][found]].reset_index(drop=True)
        distance = np.clip(1.0 - similarity[0][found].astype(np.float64), 0.0, 2.0)
        hits = hits.assign(
            distance=np.round(distance, DISTANCE_DECIMALS),
            _other=ids[0][found] != row,  # the query frame first among exact ties
        )
        hits = hits.sort_values(["distance", "_other", "log_id", "frame_index"], kind="stable")
        hits = hits.drop(columns="_other").reset_index(drop=True)
        hits.insert(0, "rank", np.arange(1, len(hits) + 1))
        return hits

    def serialize(self) -> bytes:
        import faiss

        return faiss.serialize_index(self.index).tobytes()

    @classmethod
    def restore(cls, state: dict[str, Any], index_bytes: bytes, keys: pd.DataFrame) -> FrameIndex:
        """The index as :meth:`serialize` and :meth:`state` left it."""
        import faiss

        index = faiss.deserialize_index(np.frombuffer(index_bytes, dtype=np.uint8))
        if index.ntotal != len(keys):
            raise ValueError(f"similarity index has {index.ntotal} vectors but {len(keys)} keys")
        return cls(
            engine_sha=str(state["engine_sha"]),
            dim=int(state["dim"]),
            index=index,
            keys=keys[list(KEY_COLUMNS)].reset_index(drop=True),
            batches={str(k): dict(v) for k, v in state["batches"].items()},
            metric=str(state.get("metric", METRIC)),
        )

    def state(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "engine_sha": self.engine_sha,
            "dim": self.dim,
            "rows": self.rows,
            "batches": self.batches,
        }


@dataclass(frozen=True)
class UpdatePlan:
    """What an index update does: start over (and why) or append ``add`` to what it has."""

    rebuild: bool
    reason: str
    add: tuple[str, ...]


def plan_update(
    state: dict[str, Any] | None, batches: dict[str, str], engine_sha: str, metric: str = METRIC
) -> UpdatePlan:
    """Rebuild or append, given the previous index ``state`` and the published ``batches``.

    Rebuilds when there is no index, the engine changed (a new embedding space), the metric
    changed, or a batch already indexed was re-mined or removed (its rows cannot be patched
    in place); otherwise adds only the batches published since.
    """
    everything = tuple(sorted(batches))
    if state is None:
        return UpdatePlan(True, "no index yet", everything)
    if state.get("engine_sha") != engine_sha:
        old = str(state.get("engine_sha"))[:12]
        return UpdatePlan(
            True, f"embedding space changed: engine {old} → {engine_sha[:12]}", everything
        )
    if state.get("metric") != metric:
        return UpdatePlan(True, f"metric changed: {state.get('metric')} → {metric}", everything)
    indexed = state.get("batches", {})
    changed = sorted(b for b, record in indexed.items() if batches.get(b) != record.get("checksum"))
    if changed:
        return UpdatePlan(
            True, f"{len(changed)} indexed batch(es) re-mined or removed ({changed[0]})", everything
        )
    new = tuple(b for b in everything if b not in indexed)
    return UpdatePlan(False, f"{len(new)} new batch(es)" if new else "up to date", new)
