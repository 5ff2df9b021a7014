"""The deployment group's lake reads and writes: staging on the run branch, inputs from main.

Every deployment asset stages what it makes (engines, gate reports) on the run's branch and
reads its inputs back by commit and SHA-256; kept here so the assets only say what they stage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.lake.layout import DATASETS_PREFIX, MAIN_BRANCH, training_rows_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import commit_changes, ensure_run_branch, root_run_id_of

from .frames import LabelledFrames, labelled_frames
from .payloads import StagedObject

GROUP = "deployment"


def stage_objects(
    lake: VersionedLake, context: dg.AssetExecutionContext, objects: dict[str, bytes], message: str
) -> dict[str, StagedObject]:
    """Write ``objects`` on the run branch in one commit; one ``StagedObject`` per key.

    The commit id, not the branch, is what later steps read from: run branches are deleted
    once published, commits stay.
    """
    branch = ensure_run_branch(lake, root_run_id_of(context.run))
    commit = commit_changes(
        lake,
        branch,
        message,
        {"kind": GROUP, "dagster_run_id": context.run.run_id, "asset": context.asset_key.path[-1]},
        puts=objects,
    )
    return {
        key: StagedObject(
            key=key, sha256=hashlib.sha256(data).hexdigest(), size=len(data), commit=commit
        )
        for key, data in objects.items()
    }


def read_staged(lake: VersionedLake, entry: StagedObject | Mapping[str, Any]) -> bytes:
    """The bytes of a staged object, refused if they no longer hash as recorded."""
    staged = entry if isinstance(entry, StagedObject) else StagedObject.from_dict(entry)
    data = lake.get_object(staged.commit, staged.key)
    if hashlib.sha256(data).hexdigest() != staged.sha256:
        raise ValueError(f"{staged.key} at {staged.commit[:12]} does not match its SHA-256")
    return data


def calibration_frames(lake: VersionedLake, dataset_version: str) -> pd.DataFrame:
    """The calibration frames of ``dataset_version`` on main; refused before calibration_set."""
    key = f"{DATASETS_PREFIX}calibration/{dataset_version}.parquet"
    if not lake.object_exists(MAIN_BRANCH, key):
        raise ValueError(
            f"no calibration set for {dataset_version} on main ({key}): materialize "
            "calibration_set for the model's dataset version first"
        )
    rows = lake.get_parquet(MAIN_BRANCH, key)
    return load_frames(lake, rows, MAIN_BRANCH)


def dataset_split_frames(
    lake: VersionedLake, candidate: Mapping[str, Any], splits: tuple[str, ...]
) -> tuple[pd.DataFrame, ...]:
    """The frames of each of ``splits`` of the candidate's training dataset, in that order.

    Read at the dataset commit the candidate recorded (its ``dataset_commit``), so what QAT
    or pruning learns from is exactly what the network was trained on, even when a newer
    dataset has landed since.
    """
    commit = str(candidate["dataset_commit"])
    rows = lake.get_parquet(commit, training_rows_key(str(candidate["dataset_version"])))
    return tuple(load_frames(lake, rows[rows["split"] == split], commit) for split in splits)


def benchmark_frames(lake: VersionedLake) -> tuple[LabelledFrames, str]:
    """The benchmark set on main with its version; refused before benchmark_set."""
    manifest = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if manifest is None:
        raise ValueError("no benchmark_set on main: materialize benchmark_set first")
    rows = lake.get_parquet(MAIN_BRANCH, manifest["frames_key"])
    return labelled_frames(load_frames(lake, rows, MAIN_BRANCH)), str(manifest["version"])


def engine_bytes(
    lake: VersionedLake, onnx_model: Mapping[str, Any], quantized_engine: Mapping[str, Any]
) -> dict[str, bytes]:
    """The FP32 engine and every engine ``quantized_engine`` staged (FP16, and INT8 unless no
    INT8 held every slice), each hash-checked."""
    return {
        "fp32": read_staged(lake, onnx_model["onnx"]),
        **{
            precision: read_staged(lake, entry)
            for precision, entry in quantized_engine["engines"].items()
        },
    }


def same_candidate(*outputs: Mapping[str, Any]) -> str:
    """The one model version all ``outputs`` belong to; mixing candidates is refused."""
    versions = {str(output["model_version"]) for output in outputs}
    if len(versions) != 1:
        raise ValueError(f"deployment inputs belong to different model versions {sorted(versions)}")
    return versions.pop()
