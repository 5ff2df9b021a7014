"""Dataset assets (group ``datasets``): benchmark, training and calibration sets.

Each publishes itself — objects written on the run branch, merged into ``main`` in one act —
because a dataset's identity is the commit that holds it, and the training dataset is tagged
(``dataset-vNNNN``) at exactly that commit. Everything reads the published (``main``) state
of the upstream layers.
"""

import dagster as dg

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import (
    DATASETS_PREFIX,
    MAIN_BRANCH,
    training_rows_key,
    training_transfer_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.metadata_tables import markdown_table
from aiinfra_pipelines.mining.assets import auto_labels, mined_badcases

from .benchmark import benchmark_log_ids
from .calibration import coverage_report, select_calibration_set
from .manifest import add_transfer_set, build_manifest, next_dataset_version
from .selection import (
    BENCHMARK_MANIFEST,
    TRAINING_LATEST,
    configured_training_rows,
    next_benchmark_manifest,
    published_frames,
    transfer_rows,
)
from .settings import CalibrationGates, DatasetSettings
from .split import split_by_log

GROUP = "datasets"


class BenchmarkChange(dg.Config):
    """An operator's explicit change of benchmark membership (launchpad config in the UI)."""

    add_logs: list[str] = []
    remove_logs: list[str] = []
    reason: str = ""


@dg.asset(group_name=GROUP, kinds={"lakefs", "pandas"}, deps=[mined_badcases])
def benchmark_set(
    context: dg.AssetExecutionContext, lake: VersionedLake, config: BenchmarkChange
) -> dg.MaterializeResult:
    """A frozen held-out set per slice that never enters training.

    Existing members never change implicitly: new data only covers slices that had no
    benchmark logs yet. Changing membership is an explicit, recorded act: materialize with
    ``add_logs`` / ``remove_logs`` and a ``reason``, which the manifest's ``changes`` keeps.
    """
    frames = published_frames(lake)
    existing, manifest = next_benchmark_manifest(
        lake,
        frames,
        add_logs=config.add_logs,
        remove_logs=config.remove_logs,
        reason=config.reason or None,
    )
    members = frames[frames["log_id"].isin(benchmark_log_ids(manifest))]
    changed = existing is None or existing["version"] != manifest["version"]
    commit = lake.resolve_ref(MAIN_BRANCH)
    if changed:
        rows_key = f"{DATASETS_PREFIX}benchmark/{manifest['version']}/frames.parquet"
        manifest["frames_key"] = rows_key
        commit = publish_objects(
            lake,
            root_run_id_of(context.run),
            {rows_key: parquet_bytes(members), BENCHMARK_MANIFEST: json_document(manifest)},
            f"benchmark set {manifest['version']}",
            {
                "kind": "benchmark",
                "version": manifest["version"],
                "dagster_run_id": context.run.run_id,
            },
        )
    return dg.MaterializeResult(
        metadata={
            "version": manifest["version"],
            "changed": changed,
            "commit": commit,
            "logs": manifest["logs"],
            "frames": len(members),
            "uncovered_slices": dg.MetadataValue.json(manifest.get("uncovered_slices", [])),
            "changes": dg.MetadataValue.json(manifest.get("changes", [])),
        }
    )


@dg.asset(group_name=GROUP, kinds={"lakefs", "pandas"}, deps=[benchmark_set, auto_labels])
def training_dataset(
    context: dg.AssetExecutionContext, lake: VersionedLake
) -> dg.MaterializeResult:
    """Base data plus the accepted badcases (all while they fit in ``datasets.yaml``
    ``selection.budget_frames``, else the budgeted selection's choice), split train/val by log,
    tagged on ``main``. Frames without usable labels (held back by label QC, or from a log
    without ground truth), outside the val logs, are published beside it as the version's
    transfer set: never trained on with labels, only through a teacher.

    The merge commit that publishes it is the dataset's identity; the tag ``dataset-vNNNN``
    points at it and every model trained on it records that commit.
    """
    settings = DatasetSettings.load()
    rows, qc = configured_training_rows(lake)
    selection = qc.pop("selection")
    unlabelled_rows = qc.pop("unlabelled_rows")
    if rows.empty:
        raise ValueError(
            "no trainable frames: everything is benchmark, held back by label QC or "
            "without ground truth"
        )
    dataset = split_by_log(rows, settings.val_fraction, settings.seed)
    transfer = transfer_rows(unlabelled_rows, dataset)
    version = next_dataset_version(lake.list_tags())
    rows_key, transfer_key = training_rows_key(version), training_transfer_key(version)
    manifest = build_manifest(
        dataset,
        source_commits=sorted(dataset["source_commit"].unique()),
        label_qc={**qc, "badcases": int(dataset["badcase"].sum())},
        version=version,
    )
    objects = {rows_key: parquet_bytes(dataset)}
    if len(transfer):
        manifest = add_transfer_set(manifest, transfer, transfer_key)
        objects[transfer_key] = parquet_bytes(transfer)
    manifest_key = f"{DATASETS_PREFIX}training/{version}/manifest.json"
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {**objects, manifest_key: json_document(manifest)},
        f"training dataset {version}",
        {"kind": "dataset", "version": version, "dagster_run_id": context.run.run_id},
    )
    lake.create_tag(version, commit)
    pointer = {
        "version": version,
        "commit": commit,
        "rows_key": rows_key,
        "manifest_key": manifest_key,
        # Frames without usable labels, learned from the teacher alone when distillation is on.
        **({"transfer_rows_key": transfer_key} if len(transfer) else {}),
    }
    publish_objects(
        lake,
        root_run_id_of(context.run),
        {TRAINING_LATEST: json_document(pointer)},
        f"latest training dataset is {version}",
        {"kind": "dataset-pointer", "version": version},
    )
    counts = dataset.groupby(["slice", "split"]).size().unstack(fill_value=0).reset_index()
    return dg.MaterializeResult(
        metadata={
            "dataset_version": version,
            "dataset_commit": commit,
            "frames": len(dataset),
            "badcases": int(dataset["badcase"].sum()),
            "transfer_frames": len(transfer),
            "transfer_by_reason": dg.MetadataValue.json(
                manifest.get("transfer", {}).get("by_reason", {})
            ),
            "logs": dg.MetadataValue.json(manifest["log_counts"]),
            "label_qc": dg.MetadataValue.json(manifest["label_qc"]),
            "per_slice": dg.MetadataValue.md(markdown_table(counts)),
            # Accepted badcases vs the label budget (datasets.yaml selection): all taken while
            # they fit; beyond it, what the budgeted selection chose per slice and why.
            "selection": dg.MetadataValue.json(selection),
        }
    )


@dg.asset(group_name=GROUP, kinds={"lakefs", "pandas"}, deps=[training_dataset])
def calibration_set(context: dg.AssetExecutionContext, lake: VersionedLake) -> dg.MaterializeResult:
    """A representative quantization sample from the latest training dataset, every slice covered.

    Real driving frames with minimum shares per condition (``gates.yaml`` ``calibration``); a
    source that cannot meet them fails here, naming the missing condition.
    """
    pointer = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    if pointer is None:
        raise ValueError("no training dataset on main: materialize training_dataset first")
    rows = lake.get_parquet(pointer["commit"], pointer["rows_key"])
    calibration = CalibrationGates.load()
    # Train and val both: calibration needs coverage, not held-out data (the benchmark is
    # never used, so engine parity is still measured on unseen frames).
    sample = select_calibration_set(
        rows, calibration.samples, calibration.min_share, DatasetSettings.load().seed
    )
    key = f"{DATASETS_PREFIX}calibration/{pointer['version']}.parquet"
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {key: parquet_bytes(sample)},
        f"calibration set for {pointer['version']}",
        {"kind": "calibration", "dataset_version": pointer["version"]},
    )
    return dg.MaterializeResult(
        metadata={
            "frames": len(sample),
            "dataset_version": pointer["version"],
            "commit": commit,
            "coverage": dg.MetadataValue.json(coverage_report(sample, calibration.min_share)),
        }
    )
