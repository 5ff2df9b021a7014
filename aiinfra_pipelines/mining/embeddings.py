"""Per-frame embeddings as mining records them: one row per frame, keyed like the badcases.

Mining already runs the deployed engine over every frame of a batch; the engine's third output
(``perception.contract.EMBEDDING_OUTPUT``) comes back from the same session run, so storing it
costs no inference. Rows carry the engine's SHA-256: embeddings of different engines live in
different spaces and must never be compared (``curation.similarity`` indexes one engine's).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EMBEDDING_COLUMNS: tuple[str, ...] = ("log_id", "frame_index", "engine_sha", "embedding")


def empty_embedding_table() -> pd.DataFrame:
    """No rows, the right columns (a batch without frames, or an engine without embeddings)."""
    return pd.DataFrame({column: pd.Series(dtype=object) for column in EMBEDDING_COLUMNS}).astype(
        {"frame_index": "int64"}
    )


def embedding_table(frames: pd.DataFrame, vectors: np.ndarray, engine_sha: str) -> pd.DataFrame:
    """``frames``' keys with their N x D ``vectors`` (float32 lists) and the engine's SHA."""
    if len(vectors) != len(frames):
        raise ValueError(f"{len(vectors)} embeddings for {len(frames)} frames")
    vectors = np.asarray(vectors, dtype=np.float32)
    return pd.DataFrame(
        {
            "log_id": frames["log_id"].astype(str).to_numpy(),
            "frame_index": frames["frame_index"].to_numpy(dtype=np.int64),
            "engine_sha": engine_sha,
            "embedding": list(vectors),
        },
        columns=list(EMBEDDING_COLUMNS),
    )


def concat_embedding_tables(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-log tables stacked in order (the empty table when there are none)."""
    return pd.concat(parts, ignore_index=True) if parts else empty_embedding_table()
