"""Auto-labels of a batch of several logs: the QC figures cover every log of the batch."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
)


def test_label_qc_metadata_counts_every_log_of_the_batch(tmp_path, instance):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    logs = [
        make_synthetic_log(n_frames=n, seed=seed, **CAMERA_SIZE)
        for seed, n in ((31, 12), (32, 9), (33, 7))
    ]
    (partition,) = ingest_and_mine(instance, resources, "qc", logs, groups=("ingest",))

    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("auto_labels"),
        instance=instance,
        resources=resources,
        partition_key=partition,
    )

    labels = result.output_for_node("auto_labels")
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert len(labels) == metadata["frames"].value == 28
    assert labels["log_id"].nunique() == 3
    qc = metadata["qc"].value
    assert qc["frames"] == 28
    assert qc["held_back"] == metadata["held_back"].value == int(labels["held_back"].sum())
