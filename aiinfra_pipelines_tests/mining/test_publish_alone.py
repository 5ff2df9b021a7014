"""A publish step launched alone (automation can do that) merges nothing and fails nothing."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
)


def test_publish_step_alone_after_its_log_was_mined_is_a_no_op(tmp_path, instance):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    log = make_synthetic_log(n_frames=8, seed=5, **CAMERA_SIZE)
    (partition,) = ingest_and_mine(instance, resources, "alone", [log])
    main_before = lake.resolve_ref(MAIN_BRANCH)

    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("published_mining"),
        instance=instance,
        resources=resources,
        partition_key=partition,
    )

    assert result.success
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["published"].value is False
    assert lake.resolve_ref(MAIN_BRANCH) == main_before
