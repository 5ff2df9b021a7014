"""Mining assets (group ``mining``), one partition per published upload batch.

They follow ingestion automatically (``AutomationCondition.eager()``): a newly published batch
is labelled and mined once, so mining cost grows with new frames only. The batch's logs are
worked one at a time (a log's frames are the unit the temporal rules need, and memory stays
bounded by one log). Re-materializing a batch with the same deployed engine reuses the recorded
result instead of running inference again.

``mined_badcases`` and ``frame_embeddings`` are one multi-asset (op ``mine_batch``): the engine
run that judges a frame also returns its embedding (``mining.embeddings``), so recording every
frame's embedding for similarity search costs no second inference.
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
from aiinfra_pipelines.metadata_tables import markdown_table
from aiinfra_pipelines.perception.contract import EMBEDDING_OUTPUT, perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .embeddings import concat_embedding_tables, embedding_table
from .engine_runner import engine_has_embedding, perceive_frames_with_embeddings
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

    Frames whose labellers disagree beyond the threshold are ``held_back``: their labels are
    never trained on (the training dataset offers their pixels to the cloud teacher instead, as
    its transfer set).
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
                markdown_table(held_back.head(HELD_BACK_LISTED)) if len(held_back) else "none"
            ),
            "mean_agreement": float(labels["agreement"].mean()) if len(labels) else 0.0,
            "qc": dg.MetadataValue.json(summary),
        }
    )
    return labels


def _previous_result(
    lake: VersionedLake,
    context: dg.AssetExecutionContext,
    asset: str,
    engine_sha: str,
    frames: int,
) -> pd.DataFrame | None:
    """The recorded ``asset`` partition for this batch and engine, if one exists."""
    ref = read_ref(lake, root_run_id_of(context.run))
    key = asset_object_base(dg.AssetKey(asset), context.partition_key) + ".parquet"
    if not lake.object_exists(ref, key):
        return None
    previous = lake.get_parquet(ref, key)
    ledger = previous.attrs.get("aiinfra_ledger", {})
    if ledger.get("engine_sha") == engine_sha and ledger.get("frames") == frames:
        return previous
    return None


def _previous_outputs(
    lake: VersionedLake,
    context: dg.AssetExecutionContext,
    engine_sha: str,
    frames: int,
) -> dict[str, pd.DataFrame] | None:
    """Every selected output as recorded for this engine, or None if any must be recomputed.

    Badcases and embeddings come from one inference, so they are reused together: a batch
    mined before embeddings were recorded runs once more to get them.
    """
    found = {}
    for name in sorted(context.op_execution_context.selected_output_names):
        previous = _previous_result(lake, context, name, engine_sha, frames)
        if previous is None:
            return None
        found[name] = previous
    return found


def _mine_log(
    deployed: Any, frames: pd.DataFrame, index: pd.DataFrame, labels: pd.DataFrame
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """One log's badcases and embeddings (None without them): one engine run over its frames."""
    spec = perception_spec()
    labels_of_log = labels.set_index("frame_index").loc[frames["frame_index"]]
    predictions, embeddings = perceive_frames_with_embeddings(deployed.engine, frames, spec)
    targets = (
        np.asarray(labels_of_log["occupancy"].tolist(), dtype=np.float32).reshape(
            len(labels_of_log), 3, spec.bins
        ),
        labels_of_log["lead_gap_norm"].to_numpy(dtype=np.float32),
    )
    return mine_badcases(frames, index, predictions, targets, spec=spec), embeddings


def _mine_batch(
    lake: VersionedLake,
    context: dg.AssetExecutionContext,
    deployed: Any,
    inputs: tuple[dict[str, Any], pd.DataFrame, pd.DataFrame],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(badcases, embeddings) of every log of the batch, log by log."""
    anonymized_frames, scene_index, auto_labels = inputs
    index_by_log, labels_by_log = _rows_by_log(scene_index), _rows_by_log(auto_labels)
    sha = deployed.engine.sha256
    parts, vectors = [], []
    for frames in _frames_per_log(lake, context, anonymized_frames):
        log_id = frames["log_id"].iloc[0]
        badcases, embeddings = _mine_log(
            deployed, frames, index_by_log[log_id], labels_by_log[log_id]
        )
        parts.append(badcases)
        if embeddings is not None:
            vectors.append(embedding_table(frames, embeddings, sha))
    badcases = (
        pd.concat(parts, ignore_index=True)
        if parts
        else pd.DataFrame(columns=list(BADCASE_COLUMNS))
    )
    badcases = badcases.assign(engine_version=deployed.version, engine_sha=sha)
    return badcases, concat_embedding_tables(vectors)


def _embeddings_metadata(deployed: Any, embeddings: pd.DataFrame) -> dict[str, Any]:
    engine = deployed.engine
    if not engine_has_embedding(engine):
        note = (
            f"missing: engine {deployed.version} ({engine.sha256[:12]}) has no "
            f"'{EMBEDDING_OUTPUT}' output (exported before engines carried embeddings)"
        )
        return {"frames": 0, "embeddings": note, "engine_sha256": engine.sha256}
    return {
        "frames": len(embeddings),
        "embeddings": "recorded",
        "embedding_dim": int(getattr(engine, "embedding_dim", None) or 0),
        "engine": deployed.version,
        "engine_sha256": engine.sha256,
    }


@dg.multi_asset(
    name="mine_batch",
    partitions_def=ingest_batch_partitions,
    group_name=GROUP,
    can_subset=True,
    # Not required: a run selecting one of the two (e.g. badcases and the publish step) yields
    # only that one, and Dagster would otherwise insist on the other for the publish's deps.
    outs={
        "mined_badcases": dg.AssetOut(
            is_required=False,
            kinds={"onnx", "pandas"},
            automation_condition=EAGER,
            description="Hard frames for the deployed engine: low confidence, flicker, "
            "disagreement with the teacher labels, logged events.",
        ),
        "frame_embeddings": dg.AssetOut(
            is_required=False,
            kinds={"pandas", "parquet"},
            automation_condition=EAGER,
            description="Every frame's embedding from the deployed engine (log_id, "
            "frame_index, engine_sha, embedding float32 list): what similarity search indexes. "
            "Empty, with the reason in metadata, for an engine without the embedding output.",
        ),
    },
)
def mined_badcases(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    anonymized_frames: dict[str, Any],
    scene_index: pd.DataFrame,
    auto_labels: pd.DataFrame,
) -> Iterator[dg.Output]:
    """Badcases and frame embeddings of the deployed engine, from one inference per frame.

    Runs the production engine (the bootstrap engine before the first release) batched on
    onnxruntime over the batch's frames, log by log, once per engine: a re-run with the same
    engine reuses the recorded results (badcases and embeddings alike) instead.
    """
    deployed = load_deployed_engine(lake, batch_size=EngineSettings.load().batch_size)
    frame_count = int(anonymized_frames["frames"])
    previous = _previous_outputs(lake, context, deployed.engine.sha256, frame_count)
    if previous is not None:
        outputs = _reused_outputs(previous)
    else:
        outputs = _fresh_outputs(
            deployed,
            frame_count,
            _mine_batch(lake, context, deployed, (anonymized_frames, scene_index, auto_labels)),
        )
    for name in sorted(context.op_execution_context.selected_output_names):
        table, metadata = outputs[name]
        yield dg.Output(table, name, metadata=metadata)


Outputs = dict[str, tuple[pd.DataFrame, dict[str, Any]]]


def _reused_outputs(previous: dict[str, pd.DataFrame]) -> Outputs:
    skipped = {"inference": "skipped: already mined with this engine"}
    counts = {"mined_badcases": "badcases", "frame_embeddings": "frames"}
    return {
        name: (table, {**skipped, counts[name]: len(table)}) for name, table in previous.items()
    }


def _fresh_outputs(
    deployed: Any, frame_count: int, mined: tuple[pd.DataFrame, pd.DataFrame]
) -> Outputs:
    """Both outputs of a batch just mined, each with the ledger a re-run checks for reuse."""
    badcases, embeddings = mined
    sha = deployed.engine.sha256
    for table in (badcases, embeddings):
        table.attrs["aiinfra_ledger"] = {"engine_sha": sha, "frames": frame_count}
    inference = f"ran on {frame_count} frames"
    badcase_metadata = {
        "inference": inference,
        "engine": deployed.version,
        "engine_sha256": sha,
        "badcases": len(badcases),
        "summary": dg.MetadataValue.json(badcase_summary(badcases)),
    }
    return {
        "mined_badcases": (badcases, badcase_metadata),
        "frame_embeddings": (
            embeddings,
            {"inference": inference, **_embeddings_metadata(deployed, embeddings)},
        ),
    }


published_mining = build_publish_asset(
    "published_mining",
    group=GROUP,
    deps=[auto_labels, mined_badcases],
    partitions_def=ingest_batch_partitions,
    automation_condition=EAGER,
)

__all__ = ["auto_labels", "mined_badcases", "published_mining"]  # mined_badcases: both outputs
