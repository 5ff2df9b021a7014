"""A training dataset on a lake's ``main`` exactly as ``training_dataset`` publishes it: frame
rows referencing a frames object, and the ``latest`` pointer naming the commit."""

from __future__ import annotations

import uuid

import pandas as pd

from aiinfra_pipelines.datasets.assets import TRAINING_LATEST
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import training_transfer_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects


def publish_training_dataset(
    lake: VersionedLake, frames: pd.DataFrame, version: str, transfer: pd.DataFrame | None = None
) -> None:
    """Publish ``frames`` (with a ``split`` column) as training dataset ``version``, and
    ``transfer`` (frames without a split) as its transfer set when given."""
    frames_key = "data/anonymized_frames/test-batch.parquet"
    rows = frames[["log_id", "frame_index", "split"]].assign(frames_object=frames_key)
    rows_key = f"datasets/training/{version}/rows.parquet"
    every_frame = frames.drop(columns=["split"])
    objects = {rows_key: rows.to_parquet(index=False)}
    pointer = {"version": version, "rows_key": rows_key, "manifest_key": ""}
    if transfer is not None:
        transfer_key = training_transfer_key(version)
        objects[transfer_key] = (
            transfer[["log_id", "frame_index"]].assign(frames_object=frames_key).to_parquet()
        )
        every_frame = pd.concat([every_frame, transfer], ignore_index=True)
        pointer["transfer_rows_key"] = transfer_key
    objects[frames_key] = every_frame.to_parquet(index=False)
    commit = publish_objects(
        lake, f"test-{uuid.uuid4().hex[:12]}", objects, f"dataset {version}", {}
    )
    publish_objects(
        lake,
        f"test-{uuid.uuid4().hex[:12]}",
        {TRAINING_LATEST: json_document({**pointer, "commit": commit})},
        f"latest training dataset is {version}",
        {},
    )
