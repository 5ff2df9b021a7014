"""A run killed between its writes and its merge leaves ``main`` exactly as it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, RUN_BRANCH_PREFIX
from aiinfra_pipelines.logs.synthetic import make_synthetic_log

from .helpers import land, materialize_partition, partition_of

KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import dagster as dg
    from aiinfra_pipelines.lake.local import LocalLake
    from aiinfra_pipelines.lake.io_manager import LakeIOManager
    from aiinfra_pipelines.ingest.resources import AnonymizationKey
    from aiinfra_pipelines_tests.ingest.helpers import materialize_partition

    def kill_before_merge(self, *args, **kwargs):
        # The process dies the instant it would publish: every write is done, no merge.
        os.kill(os.getpid(), signal.SIGKILL)

    LocalLake.merge = kill_before_merge
    lake = LocalLake(root=sys.argv[1])
    resources = {"lake": lake, "io_manager": LakeIOManager(lake=lake),
                 "anonymization": AnonymizationKey(key_hex="ab" * 32)}
    with dg.instance_for_test(temp_dir=sys.argv[3]) as instance:
        materialize_partition(instance, resources, sys.argv[2])
    """
)


def test_run_killed_before_merge_leaves_main_unchanged(
    local_lake, instance, ingest_resources, tmp_path
):
    batch = land(local_lake, "b-kill", [("log", make_synthetic_log(seed=21))])
    partition = partition_of(batch)
    main_before = local_lake.resolve_ref(MAIN_BRANCH)
    (tmp_path / "child_home").mkdir()

    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_RUN,
            local_lake.root,
            partition,
            str(tmp_path / "child_home"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert child.returncode == -9, child.stderr[-2000:]
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_before
    assert scene_index_view(local_lake).empty
    (orphan,) = local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
    written = {
        stat.key.split("/")[1] for stat in local_lake.list_objects(orphan.name, prefix="data/")
    }
    assert {"drive_logs", "validated_drive_logs", "anonymized_frames", "scene_index"} <= written

    # A fresh run of the same partition publishes normally; main gets it exactly once.
    rerun = materialize_partition(instance, ingest_resources, partition)
    assert rerun.success
    index = scene_index_view(local_lake)
    assert len(index) == 20 and index["log_key"].nunique() == 1
