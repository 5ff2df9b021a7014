"""Reading dataset rows back into frames with pixels, pinned to a lake commit.

Datasets store references (``frames_object`` + ``frame_index``), not pixels: a version is a
small table whose identity is the commit it was published in. Loading joins the references
with the ``anonymized_frames`` objects *at that commit*, so retraining on ``dataset-v0007``
next year reads byte-identical frames.
"""

from __future__ import annotations

import pandas as pd

from aiinfra_pipelines.lake.port import VersionedLake

FRAME_KEY = ("log_id", "frame_index")


def load_frames(lake: VersionedLake, rows: pd.DataFrame, ref: str) -> pd.DataFrame:
    """``rows`` (needs ``frames_object``, ``frame_index``) joined with their frames at ``ref``."""
    if rows.empty:
        return rows.copy()
    parts = []
    for frames_object, wanted in rows.groupby("frames_object", sort=True):
        frames = lake.get_parquet(ref, str(frames_object))
        pixel_columns = [c for c in frames.columns if c not in wanted.columns or c in FRAME_KEY]
        parts.append(wanted.merge(frames[pixel_columns], on=list(FRAME_KEY), how="inner"))
    loaded = pd.concat(parts, ignore_index=True)
    if len(loaded) != len(rows):
        raise ValueError(
            f"{len(rows) - len(loaded)} dataset row(s) have no frame at {ref[:12]}: "
            "the dataset references frames that were not published"
        )
    return loaded
