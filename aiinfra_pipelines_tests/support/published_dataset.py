"""A training dataset on a lake's ``main`` exactly as ``training_dataset`` publishes it: frame
rows referencing a frames object, and the ``latest`` pointer naming the commit."""

from __future__ import annotations

import uuid

import pandas as pd

from aiinfra_pipelines.datasets.assets import TRAINING_LATEST
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects


def publish_training_dataset(lake: VersionedLake, frames: pd.DataFrame, version: str) -> None:
    """Publish ``frames`` (with a ``split`` column) as training dataset ``version``."""
    frames_key = "data/anonymized_frames/test-batch.parquet"
    rows = frames[["log_id", "frame_index", "split"]].assign(frames_object=frames_key)
    rows_key = f"datasets/training/{version}/rows.parquet"
    commit = publish_objects(
        lake,
        f"test-{uuid.uuid4().hex[:12]}",
        {
            frames_key: frames.drop(columns=["split"]).to_parquet(index=False),
            rows_key: rows.to_parquet(index=False),
        },
        f"dataset {version}",
        {},
    )
    pointer = {"version": version, "commit": commit, "rows_key": rows_key, "manifest_key": ""}
    publish_objects(
        lake,
        f"test-{uuid.uuid4().hex[:12]}",
        {TRAINING_LATEST: json_document(pointer)},
        f"latest training dataset is {version}",
        {},
    )
