"""The similarity index in the lake: load it at a ref, bring it up to date, stage its objects.

The index lives on ``main`` under ``lake.layout.SIMILARITY_PREFIX`` (faiss bytes, the row keys
as Parquet, a JSON state). An update reads the published embeddings at one resolved commit —
recorded as the state's ``source_commit``, the commit every query then names — and appends
only the batches the state does not list yet; a changed embedding space starts over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import (
    MAIN_BRANCH,
    SIMILARITY_INDEX_KEY,
    SIMILARITY_KEYS_KEY,
    SIMILARITY_STATE_KEY,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .embeddings import embedding_batches, read_embedding_batch
from .similarity import FrameIndex, plan_update

STATE_FORMAT = 1


class NoSimilarityIndexError(LookupError):
    """No similarity index at the ref (nothing mined with embeddings, or never built)."""


@dataclass(frozen=True)
class LoadedIndex:
    """An index as stored at a ref: the searchable index and the commit it indexed."""

    index: FrameIndex
    source_commit: str  # the lake commit whose published embeddings the index holds
    ref_commit: str  # the commit the index itself was read at
    state: dict[str, Any]


@dataclass(frozen=True)
class IndexUpdate:
    index: FrameIndex
    source_commit: str
    rebuilt: bool
    reason: str
    added_batches: tuple[str, ...]
    added_rows: int

    def state(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            **self.index.state(),
            "source_commit": self.source_commit,
            "other_engine_rows": sum(
                int(b.get("other_engine_rows", 0)) for b in self.index.batches.values()
            ),
        }

    def objects(self) -> dict[str, bytes]:
        """The lake objects of this index (publish them together)."""
        return {
            SIMILARITY_INDEX_KEY: self.index.serialize(),
            SIMILARITY_KEYS_KEY: parquet_bytes(self.index.keys),
            SIMILARITY_STATE_KEY: json.dumps(self.state(), sort_keys=True, indent=1).encode(),
        }


def load_index(lake: VersionedLake, ref: str = MAIN_BRANCH) -> LoadedIndex:
    """The index at ``ref``; :class:`NoSimilarityIndexError` when there is none."""
    commit = lake.resolve_ref(ref)
    state = lake.get_json_or_none(commit, SIMILARITY_STATE_KEY)
    if state is None:
        raise NoSimilarityIndexError(
            f"no similarity index at {ref!r} (commit {commit[:12]}): materialize the "
            "similarity_index asset once mining has recorded frame embeddings"
        )
    index = FrameIndex.restore(
        state,
        lake.get_object(commit, SIMILARITY_INDEX_KEY),
        lake.get_parquet(commit, SIMILARITY_KEYS_KEY),
    )
    return LoadedIndex(index, str(state["source_commit"]), commit, state)


def _previous(lake: VersionedLake, ref: str) -> LoadedIndex | None:
    try:
        return load_index(lake, ref)
    except NoSimilarityIndexError:
        return None


def update_index(
    lake: VersionedLake, engine_sha: str, dim: int, ref: str = MAIN_BRANCH
) -> IndexUpdate:
    """The index at ``ref`` brought up to date with the embeddings published there.

    Indexes ``engine_sha``'s vectors (width ``dim``) only. Reads everything at one commit, so
    the update is a consistent snapshot even while mining keeps publishing.
    """
    commit = lake.resolve_ref(ref)
    batches = embedding_batches(lake, commit)
    previous = _previous(lake, commit)
    plan = plan_update(previous.state if previous else None, batches, engine_sha)
    index = FrameIndex(engine_sha, dim) if plan.rebuild or previous is None else previous.index
    added = 0
    for batch in plan.add:
        added += index.add_batch(batch, batches[batch], read_embedding_batch(lake, commit, batch))
    return IndexUpdate(index, commit, plan.rebuild, plan.reason, plan.add, added)
