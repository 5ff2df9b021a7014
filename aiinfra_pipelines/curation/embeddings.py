"""Published frame embeddings: what mining recorded per batch, read back at a lake ref.

``mining``'s ``frame_embeddings`` asset stores one Parquet object per upload batch (columns
``log_id, frame_index, engine_sha, embedding``); ``published_mining`` merges them into ``main``
with the batch's badcases. Readers here name the ref they read, and say nothing about which
engine's space a vector lives in beyond its ``engine_sha`` column: vectors of two engines are
not comparable, and :func:`embedding_matrix` refuses to mix them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from aiinfra_pipelines.lake.io_manager import DATA_PREFIX
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.mining.embeddings import EMBEDDING_COLUMNS, empty_embedding_table

FRAME_EMBEDDINGS_PREFIX = f"{DATA_PREFIX}/frame_embeddings/"
_SUFFIX = ".parquet"


def embedding_batches(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict[str, str]:
    """``{batch partition key: object checksum}`` of every embeddings object at ``ref``.

    The checksum identifies the object's content, so an index can tell a batch it already
    holds from one that was re-mined since (same key, new content).
    """
    return {
        stat.key[len(FRAME_EMBEDDINGS_PREFIX) : -len(_SUFFIX)]: stat.checksum
        for stat in lake.list_objects(ref, prefix=FRAME_EMBEDDINGS_PREFIX)
        if stat.key.endswith(_SUFFIX)
    }


def read_embedding_batch(lake: VersionedLake, ref: str, batch: str) -> pd.DataFrame:
    """One batch's embeddings at ``ref`` with a ``batch`` column (its partition key)."""
    table = lake.get_parquet(ref, f"{FRAME_EMBEDDINGS_PREFIX}{batch}{_SUFFIX}")
    return table.assign(batch=batch)


def published_embeddings(
    lake: VersionedLake, ref: str = MAIN_BRANCH, *, engine_sha: str | None = None
) -> pd.DataFrame:
    """Every frame embedding at ``ref`` (``EMBEDDING_COLUMNS`` + ``batch``), in batch order.

    ``engine_sha`` keeps only that engine's rows. No embeddings yet: an empty table with the
    same columns.
    """
    parts = [
        read_embedding_batch(lake, ref, batch) for batch in sorted(embedding_batches(lake, ref))
    ]
    parts = [part for part in parts if len(part)]
    if not parts:
        return empty_embedding_table().assign(batch=pd.Series(dtype=object))
    table = pd.concat(parts, ignore_index=True)
    if engine_sha is not None:
        table = table[table["engine_sha"] == engine_sha].reset_index(drop=True)
    return table[[*EMBEDDING_COLUMNS, "batch"]]


def embedding_matrix(table: pd.DataFrame) -> np.ndarray:
    """The ``embedding`` column as one contiguous float32 N x D matrix (row order kept).

    Raises ``ValueError`` for rows of more than one engine (incomparable spaces) or vectors of
    different widths.
    """
    if "engine_sha" in table.columns and table["engine_sha"].nunique() > 1:
        engines = sorted(str(sha)[:12] for sha in table["engine_sha"].unique())
        raise ValueError(
            f"embeddings of {len(engines)} engines ({', '.join(engines)}) are not comparable; "
            "select one engine_sha first"
        )
    if len(table) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    widths = {len(vector) for vector in table["embedding"]}
    if len(widths) != 1:
        raise ValueError(f"embeddings of different widths {sorted(widths)} cannot be stacked")
    return np.ascontiguousarray(np.stack(table["embedding"].to_numpy()), dtype=np.float32)
