"""Steps of one run that run in parallel must not publish each other's half-written data.

In prod every step is its own pod (``k8s_job_executor``), so independent steps of one run
execute at the same time. ``training_cycle`` has such a pair: ``calibration_set`` publishes
its objects (``publish_objects``) while ``trained_model`` → ``offline_eval`` (+ its audit) →
``published_model`` write the run branch ``run-<root run id>``. The job below has that shape
(a self-publishing asset beside a writer of the run branch and its publish step) and runs
under the multiprocess executor, one process per step as on Kubernetes. Two marker files pin
the interleaving the lake allows: the writer has put its object on the run branch but not yet
committed it when the self-publishing step publishes — the window every run-branch writer
(``LakeIOManager``, ``stage_objects``, ``record_audit``) has between ``put`` and ``commit``.
"""

import os
import re
import time
from pathlib import Path

import dagster as dg
import pytest

from aiinfra_pipelines.lake.errors import NotFoundError
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.keys import validate_branch_name
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import (
    RUN_BRANCH_PREFIX,
    ensure_run_branch,
    find_publish,
    publish_branch_name,
    publish_objects,
    publish_run_branch,
    publish_with_run_branch,
    root_run_id_of,
    root_run_id_of_branch,
    run_branch_name,
)
from aiinfra_pipelines.lake.publish_asset import build_publish_asset

LAKE_ROOT_ENV = "AIINFRA_TEST_LAKE_ROOT"
SIGNAL_DIR_ENV = "AIINFRA_TEST_SIGNAL_DIR"
WAIT_S = 60.0

DATASET_KEY = "datasets/dataset.json"
CALIBRATION_KEY = "datasets/calibration.json"
WEIGHTS_KEY = "models/weights.bin"
MODEL_STAGED = "model-staged"
CALIBRATION_PUBLISHED = "calibration-published"


def _signal(name: str) -> None:
    (Path(os.environ[SIGNAL_DIR_ENV]) / name).touch()


def _wait_for(name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not (Path(os.environ[SIGNAL_DIR_ENV]) / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name!r} signal within {WAIT_S}s: the steps did not overlap")
        time.sleep(0.05)


@dg.asset
def dataset(context: dg.AssetExecutionContext, lake: VersionedLake) -> dg.MaterializeResult:
    """Like ``training_dataset``: publishes itself before the parallel steps start."""
    commit = publish_objects(
        lake, root_run_id_of(context.run), {DATASET_KEY: b"{}"}, "dataset", {"kind": "test"}
    )
    return dg.MaterializeResult(metadata={"commit": commit})


@dg.asset(deps=[dataset])
def calibration(context: dg.AssetExecutionContext, lake: VersionedLake) -> dg.MaterializeResult:
    """Like ``calibration_set``: publishes its own objects while ``model`` is mid-write."""
    _wait_for(MODEL_STAGED)
    commit = publish_objects(
        lake,
        root_run_id_of(context.run),
        {CALIBRATION_KEY: b'{"frames": 3}'},
        "calibration",
        {"kind": "test"},
    )
    _signal(CALIBRATION_PUBLISHED)
    return dg.MaterializeResult(metadata={"commit": commit})


@dg.asset(deps=[dataset])
def model(context: dg.AssetExecutionContext, lake: VersionedLake) -> dict[str, str]:
    """Like ``trained_model`` / ``stage_objects``: writes the run branch, then its output."""
    branch = ensure_run_branch(lake, root_run_id_of(context.run))
    lake.put_object(branch, WEIGHTS_KEY, b"weights that no audit has seen yet")
    _signal(MODEL_STAGED)
    _wait_for(CALIBRATION_PUBLISHED)
    lake.commit(branch, "weights", {"kind": "test"})
    return {"weights": WEIGHTS_KEY}  # LakeIOManager: committed on the run branch


published = build_publish_asset("published", group="default", deps=[model])


def get_job() -> dg.JobDefinition:
    lake = LocalLake(root=os.environ[LAKE_ROOT_ENV])
    job = dg.define_asset_job(
        "parallel_writers",
        selection=dg.AssetSelection.all(),
        executor_def=dg.multiprocess_executor.configured({"max_concurrent": 4}),
    )
    defs = dg.Definitions(
        assets=[dataset, calibration, model, published],
        jobs=[job],
        resources={"lake": lake, "io_manager": LakeIOManager(lake=lake)},
    )
    return defs.resolve_job_def("parallel_writers")


def _materialized(result: dg.JobExecutionResult, asset: str) -> dict:
    (materialization,) = result.asset_materializations_for_node(asset)
    return {key: value.value for key, value in materialization.metadata.items()}


@pytest.mark.slow
def test_a_parallel_publish_never_carries_another_steps_unfinished_writes(
    local_lake, instance, tmp_path, monkeypatch
):
    signals = tmp_path / "signals"
    signals.mkdir()
    monkeypatch.setenv(LAKE_ROOT_ENV, local_lake.root)
    monkeypatch.setenv(SIGNAL_DIR_ENV, str(signals))

    result = dg.execute_job(dg.reconstructable(get_job), instance, raise_on_error=False)

    errors = [e.step_failure_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert result.success, errors  # before the fix: model failed, its run branch deleted under it
    calibration_commit = _materialized(result, "calibration")["commit"]
    # What the parallel publish put on main holds its own objects, not model's unfinished ones.
    assert local_lake.object_exists(calibration_commit, CALIBRATION_KEY)
    assert not local_lake.object_exists(calibration_commit, WEIGHTS_KEY)
    # The run's own publish step brought everything the run wrote, and left no branch behind.
    assert _materialized(result, "published")["published"] is True
    for key in (DATASET_KEY, CALIBRATION_KEY, WEIGHTS_KEY, "data/model/__all__.json"):
        assert local_lake.object_exists(MAIN_BRANCH, key), key
    assert local_lake.list_branches(prefix=RUN_BRANCH_PREFIX) == []


# -- the helpers themselves, without Dagster --------------------------------------------------


def test_publish_objects_leaves_the_run_branch_and_its_staged_writes_alone(local_lake):
    run_branch = ensure_run_branch(local_lake, "root-1")
    local_lake.put_object(run_branch, WEIGHTS_KEY, b"half-written")

    commit = publish_objects(local_lake, "root-1", {CALIBRATION_KEY: b"c"}, "calibration", {})

    assert local_lake.get_object(MAIN_BRANCH, CALIBRATION_KEY) == b"c"
    assert not local_lake.object_exists(commit, WEIGHTS_KEY)
    assert [b.name for b in local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)] == [run_branch]
    assert [e.key for e in local_lake.uncommitted(run_branch)] == [WEIGHTS_KEY]
    assert local_lake.log(MAIN_BRANCH, limit=1)[0].metadata["root_run_id"] == "root-1"


def test_a_retried_publish_after_a_killed_attempt_publishes_once_and_leaves_no_branch(
    local_lake,
):
    objects = {CALIBRATION_KEY: b"v2", DATASET_KEY: b"d"}
    # What a killed attempt leaves: its publish branch with a committed and a staged partial
    # write. Then another run moves the same key on main, so reusing the stale branch as it is
    # would conflict.
    stale = publish_branch_name("root-2", objects)
    local_lake.create_branch(stale, source_ref=MAIN_BRANCH)
    local_lake.put_object(stale, CALIBRATION_KEY, b"partial")
    local_lake.commit(stale, "killed attempt", {})
    local_lake.put_object(stale, DATASET_KEY, b"par")
    publish_objects(local_lake, "other-run", {CALIBRATION_KEY: b"v1"}, "other", {})

    commit = publish_objects(local_lake, "root-2", objects, "calibration", {})

    assert local_lake.get_object(commit, CALIBRATION_KEY) == b"v2"
    assert local_lake.get_object(commit, DATASET_KEY) == b"d"
    assert local_lake.list_branches(prefix=RUN_BRANCH_PREFIX) == []
    # Repeating a publish that did complete changes no content on main.
    again = publish_objects(local_lake, "root-2", objects, "calibration", {})
    assert local_lake.diff(commit, again) == []


def test_publish_branch_names_are_valid_lakefs_branch_ids_and_differ_per_key_set():
    names = {
        publish_branch_name(root, keys)
        for root in ("0f1e2d3c-4b5a-6978-8899-aabbccddeeff", "failure-0f1e2d3c-4b5a")
        for keys in ({"a/b.json": b""}, {"a/c.json": b""}, {"a/b.json": b"", "a/c.json": b""})
    }
    assert len(names) == 6
    for name in names:
        assert re.fullmatch(r"\w[-\w]*", name, re.ASCII), name
        validate_branch_name(name)
        assert root_run_id_of_branch(name) in {
            "0f1e2d3c-4b5a-6978-8899-aabbccddeeff",
            "failure-0f1e2d3c-4b5a",
        }
    uuid_root = "0f1e2d3c-4b5a-6978-8899-aabbccddeeff"  # ends in 12 hex digits, like a hash
    assert root_run_id_of_branch(run_branch_name(uuid_root)) == uuid_root
    assert root_run_id_of_branch("ingest-b1") is None
    same_keys_other_order = publish_branch_name("r", {"b": b"", "a": b""})
    assert publish_branch_name("r", {"a": b"", "b": b""}) == same_keys_other_order


def test_find_publish_and_the_run_branch_publish_ignore_self_published_objects(local_lake):
    publish_objects(local_lake, "root-3", {CALIBRATION_KEY: b"c"}, "calibration", {})

    assert find_publish(local_lake, "root-3") is None
    with pytest.raises(NotFoundError, match="nothing was written to publish"):
        publish_run_branch(local_lake, "root-3", "publish", {})


def test_publish_with_run_branch_merges_what_the_run_staged_with_the_objects(local_lake):
    branch = ensure_run_branch(local_lake, "root-4")
    local_lake.put_object(branch, WEIGHTS_KEY, b"engine")
    local_lake.commit(branch, "engine", {})

    commit = publish_with_run_branch(local_lake, "root-4", {DATASET_KEY: b"m"}, "manifest", {})

    assert local_lake.get_object(commit, WEIGHTS_KEY) == b"engine"
    assert local_lake.get_object(commit, DATASET_KEY) == b"m"
    assert not local_lake.branch_exists(run_branch_name("root-4"))
    assert find_publish(local_lake, "root-4") == commit
