"""Mining assets (group ``mining``), one partition per published upload batch.

They follow ingestion automatically (``AutomationCondition.eager()``): a newly published batch
is labelled and mined once, so mining cost grows with new frames only. The batch's logs are
worked one at a time (a log's frames are the unit the temporal rules need, and memory stays
bounded by one log). Re-materializing a batch with the same deployed engine reuses the recorded
result instead of running inference again.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from aiinfra_pipelines.ingest.assets import published_ingest
from aiinfra_pipelines.ingest.partitions import ingest_batch_partitions
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import read_ref, root_run_id_of
from aiinfra_pipelines.lake.publish_asset import build_publish_asset
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .engine_runner import perceive_frames
from .label_qc import held_back_frames, label_agreement, qc_summary
from .rules import BADCASE_COLUMNS, badcase_summary, mine_badcases
from .settings import EngineSettings, mining_config_version

GROUP = "mining"
EAGER = dg.AutomationCondition.eager()
HELD_BACK_LISTED = 50  # rows of the held-back list shown in the UI; the table has them all


def _frames_per_log(
    lake: VersionedLake, context: dg.AssetExecutionContext, manifest: dict[str, Any]
) -> Iterator[pd.DataFrame]:
    """Each accepted log's frames table, one at a time, from the batch's frames manifest."""
    ref = read_ref(lake, root_run_id_of(context.run))
    for log in manifest["logs"]:
        yield lake.get_parquet(ref, log["frames_object"])


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _rows_by_log(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``table``'s rows per ``log_id``, split once (not filtered again for every log)."""
    return dict(tuple(table.groupby("log_id", sort=False))) if len(table) else {}


@dg.asset(
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    kinds={"pandas"},
    deps=[published_ingest],
    automation_condition=EAGER,
)
def auto_labels(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    anonymized_frames: dict[str, Any],
    scene_index: pd.DataFrame,
) -> pd.DataFrame:
    """Teacher labels from simulation ground truth, with an independent second labeller's QC.

    Frames whose labellers disagree beyond the threshold are ``held_back`` and never trained on.
    """
    spec = perception_spec()
    index_by_log = _rows_by_log(scene_index)
    parts = []
    for frames in _frames_per_log(lake, context, anonymized_frames):
        occupancy, lead_gap = ground_truth_labels(frames, spec)
        index = index_by_log[frames["log_id"].iloc[0]]
        qc = label_agreement(frames, spec, index=index, teacher_labels=(occupancy, lead_gap))
        parts.append(
            qc.assign(
                occupancy=[cells.ravel().tolist() for cells in occupancy],
                lead_gap_norm=lead_gap,
                mining_config_version=mining_config_version(),
            )
        )
    labels = _concat(parts)
    if labels.empty:
        context.add_output_metadata({"frames": 0, "note": "no accepted frames in the batch"})
        return labels
    # The whole batch's QC (every log), not the last log's.
    summary = qc_summary(labels)
    held_back = held_back_frames(labels)[["log_id", "frame_index", "agreement", "reason"]]
    context.add_output_metadata(
        {
            "frames": len(labels),
            "held_back": int(labels["held_back"].sum()),
            "held_back_frames": dg.MetadataValue.md(
                held_back.head(HELD_BACK_LISTED).to_markdown(index=False)
                if len(held_back)
                else "none"
            ),
            "mean_agreement": float(labels["agreement"].mean()) if len(labels) else 0.0,
            "qc": dg.MetadataValue.json(summary),
        }
    )
    return labels


def _previous_result(
    lake: VersionedLake, context: dg.AssetExecutionContext, engine_sha: str, frames: int
) -> pd.DataFrame | None:
    """The recorded result for this log and engine, if one exists (no inference needed)."""
    ref = read_ref(lake, root_run_id_of(context.run))
    key = asset_object_base(context.asset_key, context.partition_key) + ".parquet"
    if not lake.object_exists(ref, key):
        return None
    previous = lake.get_parquet(ref, key)
    ledger = previous.attrs.get("aiinfra_ledger", {})
    if ledger.get("engine_sha") == engine_sha and ledger.get("frames") == frames:
        return previous
    return None


def _mine_log(
    deployed: Any, frames: pd.DataFrame, index: pd.DataFrame, labels: pd.DataFrame
) -> pd.DataFrame:
    """One log's badcases: the engine over its frames against its teacher labels."""
    spec = perception_spec()
    labels_of_log = labels.set_index("frame_index").loc[frames["frame_index"]]
    predictions = perceive_frames(deployed.engine, frames, spec)
    targets = (
        np.asarray(labels_of_log["occupancy"].tolist(), dtype=np.float32).reshape(
            len(labels_of_log), 3, spec.bins
        ),
        labels_of_log["lead_gap_norm"].to_numpy(dtype=np.float32),
    )
    return mine_badcases(frames, index, predictions, targets, spec=spec)


@dg.asset(
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    kinds={"onnx", "pandas"},
    automation_condition=EAGER,
)
def mined_badcases(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    anonymized_frames: dict[str, Any],
    scene_index: pd.DataFrame,
    auto_labels: pd.DataFrame,
) -> pd.DataFrame:
    """Hard frames for the deployed engine: low confidence, flicker, disagreement, events.

    Runs the production engine (the bootstrap engine before the first release) batched on
    onnxruntime over the batch's frames, log by log, once per engine: a re-run with the same
    engine reuses the recorded result.
    """
    deployed = load_deployed_engine(lake, batch_size=EngineSettings.load().batch_size)
    frame_count = int(anonymized_frames["frames"])
    previous = _previous_result(lake, context, deployed.engine.sha256, frame_count)
    if previous is not None:
        context.add_output_metadata(
            {"inference": "skipped: already mined with this engine", "badcases": len(previous)}
        )
        return previous
    index_by_log, labels_by_log = _rows_by_log(scene_index), _rows_by_log(auto_labels)
    parts = []
    for frames in _frames_per_log(lake, context, anonymized_frames):
        log_id = frames["log_id"].iloc[0]
        parts.append(_mine_log(deployed, frames, index_by_log[log_id], labels_by_log[log_id]))
    badcases = (
        pd.concat(parts, ignore_index=True)
        if parts
        else pd.DataFrame(columns=list(BADCASE_COLUMNS))
    )
    badcases = badcases.assign(engine_version=deployed.version, engine_sha=deployed.engine.sha256)
    badcases.attrs["aiinfra_ledger"] = {
        "engine_sha": deployed.engine.sha256,
        "frames": frame_count,
    }
    summary = badcase_summary(badcases)
    context.add_output_metadata(
        {
            "inference": f"ran on {frame_count} frames",
            "engine": deployed.version,
            "engine_sha256": deployed.engine.sha256,
            "badcases": len(badcases),
            "summary": dg.MetadataValue.json(summary),
        }
    )
    return badcases


published_mining = build_publish_asset(
    "published_mining",
    group=GROUP,
    deps=[auto_labels, mined_badcases],
    partitions_def=ingest_batch_partitions,
    automation_condition=EAGER,
)

__all__ = ["auto_labels", "mined_badcases", "published_mining"]
