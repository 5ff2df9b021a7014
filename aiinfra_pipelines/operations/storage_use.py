"""How much of what the lake stores is ever used in training (the seed's storage question).

Storage grows with every drive; what justifies it is training. The ratio is measured, not
estimated: stored frames are the published scene-index rows whose raw frames are in the lake,
used frames are the distinct (log, frame) pairs of every training dataset version so far. What
the cars hold only as index records is counted beside it: stored as an index, not as pixels.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from aiinfra_pipelines.datasets.split import TRAIN
from aiinfra_pipelines.ingest.views import raw_available, scene_index_view
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

TRAINING_PREFIX = f"{DATASETS_PREFIX}training/"
FRAME_KEY = ["log_id", "frame_index"]


def frames_ever_trained_on(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """Distinct (log id, frame index) in the train split of every training dataset version at
    ``ref`` (validation frames judge a model; they do not train it)."""
    parts = []
    for stat in lake.list_objects(ref, prefix=TRAINING_PREFIX):
        if stat.key.endswith("/dataset.parquet"):
            rows = lake.get_parquet(ref, stat.key, columns=[*FRAME_KEY, "split"])
            parts.append(rows.loc[rows["split"] == TRAIN, FRAME_KEY])
    if not parts:
        return pd.DataFrame(columns=FRAME_KEY)
    return pd.concat(parts, ignore_index=True).drop_duplicates()


def storage_use(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict[str, Any]:
    """Frames stored, frames ever trained on, their ratio, and what is stored index-only."""
    index = scene_index_view(lake, ref, include_index_only=True)
    if index.empty:
        raw = index
        held = index
    else:
        available = raw_available(index)
        raw, held = index[available], index[~available]
    stored = raw[FRAME_KEY].drop_duplicates() if not raw.empty else pd.DataFrame(columns=FRAME_KEY)
    used = frames_ever_trained_on(lake, ref).merge(stored, on=FRAME_KEY)
    return {
        "frames_stored": len(stored),
        "frames_ever_trained_on": len(used),
        "stored_used_in_training_ratio": round(len(used) / len(stored), 4) if len(stored) else None,
        "index_only_segments": int(held["log_id"].nunique()) if not held.empty else 0,
        "index_only_frames": len(held),
    }
