"""A batch run killed between its writes and its merge leaves ``main`` exactly as it was, and
its retry (Dagster's re-execution from failure, on the same lake branch) completes it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX, run_branch_name
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines_tests.support.ingest_runs import land, partition_of
from aiinfra_pipelines_tests.support.killed_runs import retry_from_failure

from . import reexecution_job

KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import dagster as dg
    from aiinfra_pipelines.lake.local import LocalLake
    from aiinfra_pipelines_tests.ingest import reexecution_job

    def kill_before_merge(self, *args, **kwargs):
        # The process dies the instant it would publish: every write is done, no merge.
        os.kill(os.getpid(), signal.SIGKILL)

    LocalLake.merge = kill_before_merge
    instance = dg.DagsterInstance.get()  # DAGSTER_HOME: the test's instance, on disk
    instance.add_dynamic_partitions("ingest_batches", [sys.argv[1]])
    dg.execute_job(
        dg.reconstructable(reexecution_job.get_job),
        instance,
        tags={"dagster/partition": sys.argv[1]},
    )
    """
)


def test_batch_run_killed_before_merge_leaves_main_unchanged_and_its_retry_completes(
    local_lake, instance, dagster_home, monkeypatch
):
    monkeypatch.setenv(reexecution_job.LAKE_ROOT_ENV, local_lake.root)
    batch = land(
        local_lake,
        "b-kill",
        [
            ("a", make_synthetic_log(seed=21)),
            ("b", make_synthetic_log(seed=22)),
            ("cut", encode_drive_log(make_synthetic_log(seed=23))[:-400]),
        ],
    )
    partition = partition_of(batch)
    main_before = local_lake.resolve_ref(MAIN_BRANCH)

    child = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, partition],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )

    assert child.returncode == -9, child.stderr[-2000:]
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_before
    assert scene_index_view(local_lake).empty and quarantine_view(local_lake).empty
    (killed,) = instance.get_runs()
    (orphan,) = local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
    assert orphan.name == run_branch_name(killed.run_id)
    written = {
        stat.key.split("/")[1] for stat in local_lake.list_objects(orphan.name, prefix="data/")
    }
    assert {"drive_logs", "validated_drive_logs", "anonymized_frames", "scene_index"} <= written

    # The run monitor marks the dead run failed; the retry re-executes from the failure, with
    # the parent's tags (as the daemon's run retries do).
    retry = retry_from_failure(instance, killed, reexecution_job.get_job)

    assert retry.success
    assert retry.dagster_run.root_run_id == killed.run_id
    index = scene_index_view(local_lake)
    assert index.groupby("log_key").size().to_dict() == {"logs/a.mcap": 20, "logs/b.mcap": 20}
    assert list(quarantine_view(local_lake)["log_key"]) == ["logs/cut.mcap"]
    assert not local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
