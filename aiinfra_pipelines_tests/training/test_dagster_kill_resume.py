"""A Dagster run SIGKILLed inside ``trained_model`` resumes from its checkpoint when re-executed.

The child process runs the real ``trained_model`` asset (a reconstructable job, the in-process
executor, an on-disk instance under the test's DAGSTER_HOME) on a lake holding a small
training dataset, and is killed with its whole process group once the first epoch's checkpoint
has landed. The re-execution from failure (what the daemon's run retries do) must continue from
that checkpoint into the same MLflow run, complete, and register exactly one model version:
nothing half-registered by the killed run, no second run or version minted by the retry.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import dagster as dg
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.training.checkpointing import RUN_ID_FILE, completed_epochs
from aiinfra_pipelines.training.module import VAL_LOSS
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.tracking import RESUMED_TAG
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.killed_runs import kill_when_paused, retry_from_failure
from aiinfra_pipelines_tests.support.published_dataset import publish_training_dataset

from . import _training_job
from .conftest import SMALL_CONFIG

pytestmark = pytest.mark.slow

VERSION = "dataset-v0001"
EPOCHS = 2
KILL_AFTER_EPOCHS = 1
HANG_GUARD_S = 900  # only a wedged child gets here; the kill itself waits on no clock

# The child: the asset's training step pauses in the first step after KILL_AFTER_EPOCHS
# epochs (checkpointed), writes the marker and waits for the parent's SIGKILL.
KILLED_RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import dagster as dg
    from aiinfra_pipelines_tests.training import _training_job
    from aiinfra_pipelines_tests.training._resume_worker import _pause_at

    _pause_at(int(sys.argv[1]), Path(sys.argv[2]))
    dg.execute_job(
        dg.reconstructable(_training_job.get_job),
        dg.DagsterInstance.get(),  # DAGSTER_HOME: the test's instance, on disk
    )
    """
)


def _materialization(result: dg.ExecuteJobResult) -> dict:
    (event,) = result.asset_materializations_for_node("trained_model")
    return {key: getattr(value, "value", value) for key, value in event.metadata.items()}


def test_a_dagster_run_killed_inside_trained_model_resumes_into_the_same_mlflow_run(
    small_split, instance, dagster_home, tmp_path, monkeypatch
):
    train, val = small_split
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    publish_training_dataset(
        lake,
        pd.concat([train.assign(split="train"), val.assign(split="val")], ignore_index=True),
        VERSION,
    )
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    checkpoint_dir = tmp_path / "checkpoints" / VERSION
    monkeypatch.setenv(_training_job.LAKE_ROOT_ENV, lake.root)
    monkeypatch.setenv(_training_job.TRACKING_URI_ENV, tracking_uri)
    monkeypatch.setenv(_training_job.CHECKPOINT_ROOT_ENV, str(tmp_path / "checkpoints"))
    marker, log = tmp_path / "paused", tmp_path / "child.log"
    small = {"training.yaml": {**SMALL_CONFIG, "max_epochs": EPOCHS}}
    with resources_with(tmp_path / "resources", small), log.open("wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN, str(KILL_AFTER_EPOCHS), str(marker)],
            cwd=PROJECT_ROOT,
            env={**os.environ},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill takes its workers too
        )
        kill_when_paused(child, marker, log, HANG_GUARD_S)

        assert child.returncode == -signal.SIGKILL
        (killed,) = instance.get_runs()
        assert killed.status == dg.DagsterRunStatus.STARTED  # died in flight, nobody noticed
        assert completed_epochs(checkpoint_dir / "last.ckpt") == KILL_AFTER_EPOCHS
        mlflow_run_id = (checkpoint_dir / RUN_ID_FILE).read_text()
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        assert client.get_run(mlflow_run_id).info.status == "RUNNING"
        registered = str(load_training_config()["mlflow"]["registered_model"])
        assert client.search_model_versions(f"name = '{registered}'") == []

        # The run monitor marks the dead run failed; the retry re-executes from the failure,
        # with the parent's tags (as the daemon's run retries do).
        retry = retry_from_failure(instance, killed, _training_job.get_job)

    assert retry.success
    assert retry.dagster_run.root_run_id == killed.run_id
    metadata = _materialization(retry)
    assert metadata["resumed_from_epoch"] == KILL_AFTER_EPOCHS > 0
    assert metadata["epochs"] == EPOCHS
    assert metadata["mlflow_run_id"] == mlflow_run_id
    assert metadata["dataset_version"] == VERSION
    run = client.get_run(mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[RESUMED_TAG] == str(KILL_AFTER_EPOCHS)
    assert run.data.tags["resumed.dagster_run_id"] == retry.run_id
    assert run.data.params["dagster_run_id"] == killed.run_id  # params are immutable
    assert [found.info.run_id for found in client.search_runs([run.info.experiment_id])] == [
        mlflow_run_id
    ]
    history = client.get_metric_history(mlflow_run_id, VAL_LOSS)
    assert sorted(point.step for point in history) == list(range(EPOCHS))  # no hole, no repeat
    (version,) = client.search_model_versions(f"name = '{registered}'")
    assert (str(version.version), version.run_id) == (str(metadata["model_version"]), mlflow_run_id)
    assert version.tags["dagster_run_id"] == retry.run_id
