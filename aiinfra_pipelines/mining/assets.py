"""Mining assets (group ``mining``), one partition per published drive log.

They follow ingestion automatically (``AutomationCondition.eager()``): a newly published log
is labelled and mined once, so mining cost grows with new frames only. Re-materializing a log
with the same deployed engine reuses the recorded result instead of running inference again.
"""

import io

import dagster as dg
import numpy as np
import pandas as pd

from aiinfra_pipelines.ingest.assets import anonymized_frames, published_ingest, scene_index
from aiinfra_pipelines.ingest.partitions import drive_log_partitions
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import read_ref, root_run_id_of
from aiinfra_pipelines.lake.publish_asset import build_publish_asset
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .engine_runner import run_engine_over_frames
from .label_qc import held_back_frames, label_agreement, qc_summary
from .rules import badcase_summary, mine_badcases
from .settings import mining_config

GROUP = "mining"
EAGER = dg.AutomationCondition.eager()
HELD_BACK_LISTED = 50  # rows of the held-back list shown in the UI; the table has them all


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"pandas"},
    deps=[published_ingest],
    automation_condition=EAGER,
)
def auto_labels(
    context: dg.AssetExecutionContext, anonymized_frames: pd.DataFrame, scene_index: pd.DataFrame
) -> pd.DataFrame:
    """Teacher labels from simulation ground truth, with an independent second labeller's QC.

    Frames whose labellers disagree beyond the threshold are ``held_back`` and never trained on.
    """
    spec = perception_spec()
    occupancy, lead_gap = ground_truth_labels(anonymized_frames, spec)
    qc = label_agreement(
        anonymized_frames, spec, index=scene_index, teacher_labels=(occupancy, lead_gap)
    )
    labels = qc.assign(
        occupancy=[cells.ravel().tolist() for cells in occupancy],
        lead_gap_norm=lead_gap,
        mining_config_version=str(mining_config()["version"]),
    )
    summary = qc_summary(qc)
    held_back = held_back_frames(qc)[["log_id", "frame_index", "agreement", "reason"]]
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
    previous = pd.read_parquet(io.BytesIO(lake.get_object(ref, key)))
    ledger = previous.attrs.get("aiinfra_ledger", {})
    if ledger.get("engine_sha") == engine_sha and ledger.get("frames") == frames:
        return previous
    return None


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"onnx", "pandas"},
    automation_condition=EAGER,
)
def mined_badcases(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    anonymized_frames: pd.DataFrame,
    scene_index: pd.DataFrame,
    auto_labels: pd.DataFrame,
) -> pd.DataFrame:
    """Hard frames for the deployed engine: low confidence, flicker, disagreement, events.

    Runs the production engine (the bootstrap engine before the first release) batched on
    onnxruntime over this log's frames, once per engine: a re-run with the same engine reuses
    the recorded result.
    """
    deployed = load_deployed_engine(lake, batch_size=int(mining_config()["engine"]["batch_size"]))
    previous = _previous_result(lake, context, deployed.engine.sha256, len(anonymized_frames))
    if previous is not None:
        context.add_output_metadata(
            {"inference": "skipped: already mined with this engine", "badcases": len(previous)}
        )
        return previous
    spec = perception_spec()
    predictions = run_engine_over_frames(deployed.engine, anonymized_frames, spec)
    labels = (
        np.asarray(auto_labels["occupancy"].tolist(), dtype=np.float32).reshape(
            len(auto_labels), 3, spec.bins
        ),
        auto_labels["lead_gap_norm"].to_numpy(dtype=np.float32),
    )
    badcases = mine_badcases(anonymized_frames, scene_index, predictions, labels, spec=spec)
    badcases = badcases.assign(engine_version=deployed.version, engine_sha=deployed.engine.sha256)
    badcases.attrs["aiinfra_ledger"] = {
        "engine_sha": deployed.engine.sha256,
        "frames": len(anonymized_frames),
    }
    summary = badcase_summary(badcases)
    context.add_output_metadata(
        {
            "inference": f"ran on {len(anonymized_frames)} frames",
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
    partitions_def=drive_log_partitions,
    automation_condition=EAGER,
)

__all__ = ["anonymized_frames", "auto_labels", "mined_badcases", "published_mining", "scene_index"]
