"""``log_id:frame_index`` → its nearest frames, with each one's slice and logged events.

What ``aiinfra similar`` prints and the "more like this" asset records. The scene index rows
(slice, event flags) are read at the commit the index was built from, so a result describes
the frames as they were indexed — one snapshot, named in the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .similarity_store import LoadedIndex, load_index

EVENT_PREFIX = "event_"
RESULT_COLUMNS: tuple[str, ...] = (
    "rank",
    "frame",
    "log_id",
    "frame_index",
    "distance",
    "slice",
    "events",
    "batch",
)
# A log id of at most 200 characters and a frame index of at most 9 digits: a reference past
# that is no frame of this fleet (and 5,000 digits would not even convert to an int).
_FRAME = re.compile(r"^(?P<log>[^\x00-\x1f]{1,200}):(?P<index>\d{1,9})$")


class FrameSyntaxError(ValueError):
    """A frame reference that is not ``<log_id>:<frame_index>``."""


def parse_frame(reference: str) -> tuple[str, int]:
    """``"<log_id>:<frame_index>"`` → (log_id, frame_index); the last colon splits them."""
    match = _FRAME.match(reference.strip())
    if match is None:
        shown = reference if len(reference) <= 60 else reference[:60] + "…"
        raise FrameSyntaxError(
            f"frame {shown!r} is not <log_id>:<frame_index> (e.g. 3f2a…:17: a log id of at "
            "most 200 characters, the index a non-negative integer of at most 9 digits)"
        )
    return match["log"], int(match["index"])


@dataclass(frozen=True)
class SimilarFrames:
    """The neighbours of ``query`` and the index they came from."""

    query: str
    rows: pd.DataFrame  # RESULT_COLUMNS, nearest first (the query frame itself first)
    index_commit: str  # the lake commit whose embeddings the index holds
    engine_sha: str
    metric: str
    indexed_frames: int

    def records(self) -> list[dict]:
        """One dict per neighbour (``--json``): the result columns plus the index commit."""
        return [
            {
                "frame": row.frame,
                "log_id": row.log_id,
                "frame_index": int(row.frame_index),
                "distance": float(row.distance),
                "slice": row.slice,
                "events": list(row.events),
                "rank": int(row.rank),
                "batch": row.batch,
                "index_commit": self.index_commit,
                "engine_sha": self.engine_sha,
                "metric": self.metric,
            }
            for row in self.rows.itertuples(index=False)
        ]


def _scene_rows(lake: VersionedLake, commit: str, batches: list[str]) -> pd.DataFrame:
    """The scene-index rows of ``batches`` at ``commit`` (the index's partitions share keys)."""
    parts = []
    for batch in batches:
        key = asset_object_base(dg.AssetKey("scene_index"), batch) + ".parquet"
        if lake.object_exists(commit, key):
            parts.append(lake.get_parquet(commit, key))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _events(scene: pd.DataFrame) -> list[list[str]]:
    flags = [c for c in scene.columns if c.startswith(EVENT_PREFIX)]
    values = scene[flags].fillna(False).astype(bool).to_numpy() if flags else None
    names = [c[len(EVENT_PREFIX) :] for c in flags]
    if values is None:
        return [[] for _ in range(len(scene))]
    return [[name for name, on in zip(names, row, strict=True) if on] for row in values]


def describe(lake: VersionedLake, hits: pd.DataFrame, commit: str) -> pd.DataFrame:
    """``hits`` (``FrameIndex.search``) with each frame's slice and events (RESULT_COLUMNS)."""
    scene = _scene_rows(lake, commit, sorted(set(hits["batch"])))
    if len(scene):
        scene = scene.assign(
            log_id=scene["log_id"].astype(str),
            frame_index=scene["frame_index"].astype("int64"),
            events=_events(scene),
        )[["log_id", "frame_index", "slice", "events"]]
        rows = hits.merge(scene, on=["log_id", "frame_index"], how="left")
    else:
        rows = hits.assign(slice=None, events=None)
    rows["events"] = [e if isinstance(e, list) else [] for e in rows["events"]]
    rows["slice"] = rows["slice"].where(rows["slice"].notna(), "unknown")
    rows["frame"] = rows["log_id"].astype(str) + ":" + rows["frame_index"].astype(str)
    return rows[list(RESULT_COLUMNS)]


def similar_frames(
    lake: VersionedLake,
    frame: str,
    k: int,
    ref: str = MAIN_BRANCH,
    *,
    loaded: LoadedIndex | None = None,
) -> SimilarFrames:
    """The ``k`` frames nearest ``frame`` (``log_id:frame_index``) in the index at ``ref``.

    Raises :class:`FrameSyntaxError`, ``similarity.UnknownFrameError``,
    ``similarity_store.NoSimilarityIndexError`` or ``ValueError`` (k < 1).
    """
    log_id, frame_index = parse_frame(frame)
    loaded = loaded or load_index(lake, ref)
    hits = loaded.index.search(log_id, frame_index, k)
    return SimilarFrames(
        query=f"{log_id}:{frame_index}",
        rows=describe(lake, hits, loaded.source_commit),
        index_commit=loaded.source_commit,
        engine_sha=loaded.index.engine_sha,
        metric=loaded.index.metric,
        indexed_frames=loaded.index.rows,
    )
