"""Faults on the ci environment's services path (``support/services.py``): S3 answering 503,
Postgres restarted under the daemon and a run, the MLflow server gone in the middle of training.

In the ci and prod environments the MLflow client uploads run artifacts (checkpoints, the
logged model, the ONNX) straight to S3 under the experiment's ``artifact_location``; the
tracking server only records where they are. Here a proxy in front of moto's S3 answers the
first PUTs with ``503 SlowDown``, as S3 does under load: the upload is retried with botocore's
backoff and lands intact; past the retries the caller gets an error naming the 503, and no
partial object is left. The tracking server runs on Postgres, as in the cycle test.

Postgres restarted: the real ``dagster-daemon`` on the ci instance
(``resources/environments/ci.dagster.yaml``) serves a small code location
(``support/restart_location.py``) whose sensor requests runs by run key; while one run writes
events, Postgres is stopped and started again. The run finishes, the daemon keeps ticking and
launches the next request, and no run key runs twice.

MLflow server unreachable during training: ``trained_model`` runs through ``dg.materialize`` on
the ci resources (tracking server on Postgres, artifacts on S3) and the server is killed once
the first epoch's metrics are in. The run fails naming the tracking server, nothing is
registered; with the server back on the same address, a second run resumes from the
checkpoint into the same MLflow run and registers exactly one version.
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from boto3.exceptions import S3UploadFailedError
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.config import PROJECT_ROOT, resources_dir
from aiinfra_pipelines.datasets.assets import TRAINING_LATEST
from aiinfra_pipelines.environment import load_environment
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.training.assets import teacher_model, trained_model
from aiinfra_pipelines.training.checkpointing import LAST_CHECKPOINT
from aiinfra_pipelines.training.module import VAL_LOSS
from aiinfra_pipelines.training.resources import MlflowTracking
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.fleet_data import fleet_frames
from aiinfra_pipelines_tests.support.http_fakes import FaultyProxy, serve
from aiinfra_pipelines_tests.support.restart_location import RUN_KEY_TAG, WATCH_ENV
from aiinfra_pipelines_tests.support.services import (
    MLFLOW_DATABASE,
    S3_CREDENTIALS,
    MlflowServer,
    Postgres,
    Services,
    free_port,
    mlflow_server,
    moto_server,
    postgres_server,
    registered_model_versions,
    running_services,
    stop_process_group,
)
from aiinfra_pipelines_tests.support.trained_networks import split_logs

pytestmark = pytest.mark.services

BUCKET = "aiinfra-mlflow"
# botocore's default ("standard") retry mode: 3 attempts in all, exponential backoff with jitter
# between them (AWS_RETRY_MODE / AWS_MAX_ATTEMPTS unset, as in ci.yaml and prod.yaml).
ATTEMPTS = 3


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with running_services(tmp_path_factory.mktemp("service-logs"), BUCKET) as started:
        yield started


@pytest.fixture
def faulty_s3(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyProxy]:
    """The MLflow client's S3 endpoint is a proxy to moto that fails what the test scripts."""
    proxy = FaultyProxy(services.s3_endpoint)
    with serve(proxy):
        for name, value in S3_CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", proxy.url)
        monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
        monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
        yield proxy


def _stored(services: Services, key: str) -> bytes | None:
    listed = services.s3().list_objects_v2(Bucket=BUCKET, Prefix=key).get("Contents") or []
    if not listed:
        return None
    return services.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_artifact_uploads_back_off_through_503s_then_land(
    services: Services, faulty_s3: FaultyProxy, tmp_path: Path
) -> None:
    tracking = MlflowTracking(
        tracking_uri=services.tracking_uri,
        experiment="s3-faults",
        artifact_location=f"s3://{BUCKET}/artifacts/s3-faults",
    )
    assert tracking.ensure_experiment() == tracking.artifact_location
    client = MlflowClient(tracking_uri=services.tracking_uri)
    experiment = client.get_experiment_by_name(tracking.experiment)
    run = client.create_run(experiment.experiment_id)
    prefix = run.info.artifact_uri.removeprefix(f"s3://{BUCKET}/")
    payload = hashlib.sha256(b"weights").digest() * 4096  # 128 KiB: one PUT, not multipart
    (tmp_path / "last.ckpt").write_bytes(payload)

    faulty_s3.fail("PUT", *[503] * (ATTEMPTS - 1))
    client.log_artifact(run.info.run_id, str(tmp_path / "last.ckpt"), "checkpoints")
    assert faulty_s3.count("PUT") == ATTEMPTS  # every refusal retried, then the upload
    assert _stored(services, f"{prefix}/checkpoints/last.ckpt") == payload
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == [
        "checkpoints/last.ckpt"
    ]

    # S3 still refusing after every attempt: the caller is told why, nothing is stored.
    (tmp_path / "epoch=1.ckpt").write_bytes(payload[::-1])
    faulty_s3.fail("PUT", *[503] * ATTEMPTS)
    with pytest.raises(S3UploadFailedError, match=r"SlowDown.*reached max retries"):
        client.log_artifact(run.info.run_id, str(tmp_path / "epoch=1.ckpt"), "checkpoints")
    assert faulty_s3.count("PUT") == 2 * ATTEMPTS
    assert _stored(services, f"{prefix}/checkpoints/epoch=1.ckpt") is None


WORKSPACE = """\
load_from:
  - python_module:
      module_name: aiinfra_pipelines_tests.support.restart_location
      working_directory: {root}
"""
WAIT_S = 240
DAEMON = Path(sys.executable).with_name("dagster-daemon")


def _wait_for(condition: Callable[[], bool], what: str, daemon: subprocess.Popen, log: Path):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert daemon.poll() is None, f"the daemon exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, (
            f"{what}: not within {WAIT_S}s {log.read_text()[-3000:]}"
        )
        time.sleep(0.5)


def _statuses(instance: dg.DagsterInstance) -> dict[str, list[dg.DagsterRunStatus]]:
    runs = collections.defaultdict(list)
    for run in instance.get_runs():
        runs[run.tags.get(RUN_KEY_TAG, "")].append(run.status)
    return dict(runs)


def test_the_daemon_and_a_run_outlive_a_postgres_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, watch = tmp_path / "dagster_home", tmp_path / "watch"
    home.mkdir()
    watch.mkdir()
    shutil.copy(resources_dir() / "environments" / "ci.dagster.yaml", home / "dagster.yaml")
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(WORKSPACE.format(root=PROJECT_ROOT))
    log = tmp_path / "daemon.log"
    with postgres_server() as postgres:
        env = {**postgres.dagster_env(), "DAGSTER_HOME": str(home), WATCH_ENV: str(watch)}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        instance = dg.DagsterInstance.get()
        success = dg.DagsterRunStatus.SUCCESS
        with log.open("w") as out:
            daemon = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("dagster-daemon")),
                    "run",
                    "-w",
                    str(workspace),
                ],
                cwd=PROJECT_ROOT,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            (watch / "request-a").touch()
            _wait_for((watch / "started-a").exists, "run a started", daemon, log)
            time.sleep(1.0)  # run a is logging to Postgres
            stopped_at = time.time()
            postgres.stop()
            time.sleep(1.0)
            postgres.start()
            restarted_at = time.time()
            (watch / "request-b").touch()  # a request the daemon sees only after the restart
            (watch / "release-a").touch()
            _wait_for((watch / "started-b").exists, "run b started", daemon, log)
            (watch / "release-b").touch()
            _wait_for(
                lambda: _statuses(instance) == {"a": [success], "b": [success]},
                f"both runs succeeded ({_statuses(instance)})",
                daemon,
                log,
            )
            time.sleep(3.0)  # more sensor ticks: still no second run of either key
            assert daemon.poll() is None, log.read_text()[-3000:]
        finally:
            stop_process_group(daemon)
        assert _statuses(instance) == {"a": [success], "b": [success]}
        (run_a,) = [r for r in instance.get_runs() if r.tags[RUN_KEY_TAG] == "a"]
        # The outage was felt (dagster-postgres retried connections) and run a wrote events on
        # both sides of it.
        assert "Retrying failed database connection" in log.read_text()
        written = [
            entry.timestamp
            for entry in instance.all_logs(run_a.run_id)
            if "waiting" in (entry.user_message or "")
        ]
        assert min(written) < stopped_at and max(written) > restarted_at, written


# -- the MLflow server unreachable during training ----------------------------------------------

DATASET_VERSION = "dataset-v0001"
# Small and quick: four epochs of the dense head on eight drives, in-process data loading.
SMALL_TRAINING = {
    "training.yaml": {"max_epochs": 4, "data": {"num_workers": 0}, "model": {"head": "dense"}}
}


def _publish_training_dataset(lake: LocalLake) -> None:
    """Eight drives as ``training_dataset`` publishes a version: rows referencing frames."""
    frames = fleet_frames(4, 2, 0)
    train, held_out = split_logs(frames)
    frames = pd.concat([train.assign(split="train"), held_out.assign(split="val")])
    frames_key = "data/anonymized_frames/test-batch.parquet"
    rows = frames[["log_id", "frame_index", "split"]].assign(frames_object=frames_key)
    rows_key = f"datasets/training/{DATASET_VERSION}/rows.parquet"
    commit = publish_objects(
        lake,
        "test-dataset",
        {
            frames_key: frames.drop(columns=["split"]).to_parquet(index=False),
            rows_key: rows.to_parquet(index=False),
        },
        f"dataset {DATASET_VERSION}",
        {},
    )
    pointer = {"version": DATASET_VERSION, "commit": commit, "rows_key": rows_key}
    publish_objects(
        lake,
        "test-pointer",
        {TRAINING_LATEST: json_document({**pointer, "manifest_key": ""})},
        "latest training dataset",
        {},
    )


def _crash_after_first_epoch(
    postgres: Postgres, server: MlflowServer, checkpoint_root: Path
) -> threading.Thread:
    """Kill the server once an epoch is both in MLflow's store and checkpointed on disk.

    Lightning logs an epoch's metrics before its epoch-end checkpoint is written, so waiting
    for the metrics alone races the checkpoint on a busy machine: the retry would then start
    from scratch and the test would judge the timing, not the resume.
    """

    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            connection = postgres.connect(MLFLOW_DATABASE)
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM metrics WHERE step = 0")
                    logged = cursor.fetchone()[0]
            finally:
                connection.close()
            # last.ckpt is renamed into place whole, so its presence means a complete epoch.
            if logged and any(checkpoint_root.rglob(LAST_CHECKPOINT)):
                server.crash()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # trains twice (a few epochs) and starts the MLflow server twice
def test_training_fails_clearly_without_its_mlflow_server_and_a_retry_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    # Fail fast instead of MLflow's default minutes of HTTP retries against a dead server.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    _publish_training_dataset(lake)
    logs, port = tmp_path / "service-logs", free_port()
    logs.mkdir()
    checkpoint_root = tmp_path / "checkpoints"
    with (
        resources_with(tmp_path / "resources", SMALL_TRAINING),
        postgres_server() as postgres,
        moto_server(logs / "moto.log") as s3_endpoint,
    ):
        services = Services(postgres, s3_endpoint, f"http://127.0.0.1:{port}")
        for name, value in services.env().items():
            monkeypatch.setenv(name, value)
        postgres.create_database(MLFLOW_DATABASE)
        services.s3().create_bucket(Bucket=BUCKET)
        settings = load_environment("ci")["mlflow"]
        resources = {
            "lake": lake,
            "io_manager": LakeIOManager(lake=lake),
            "mlflow_tracking": MlflowTracking(
                tracking_uri=services.tracking_uri,
                experiment=settings["experiment"],
                checkpoint_root=str(checkpoint_root),
                artifact_location=settings["artifact_location"],
            ),
        }
        backend = (postgres.url(MLFLOW_DATABASE), f"s3://{BUCKET}/proxied", s3_endpoint)
        with mlflow_server(*backend, logs / "mlflow.log", port=port) as server:
            watcher = _crash_after_first_epoch(postgres, server, checkpoint_root)
            # teacher_model first: trained_model takes its output (no teacher trains while
            # training.yaml distillation is off, so the outage hits the car network's training).
            failed = dg.materialize(
                [teacher_model, trained_model], resources=resources, raise_on_error=False
            )
            watcher.join(timeout=WAIT_S)
            assert server.process.poll() is not None, "training ended before the outage"
        assert not failed.success
        (failure,) = failed.get_step_failure_events()
        error = failure.step_failure_data.error
        text = error.to_string() if error else ""
        assert f"127.0.0.1:{port}" in text, text  # names the tracking server it could not reach
        assert registered_model_versions(postgres) == []  # nothing half-registered

        with mlflow_server(*backend, logs / "mlflow.log", port=port):
            retried = dg.materialize([teacher_model, trained_model], resources=resources)
            client = MlflowClient(tracking_uri=services.tracking_uri)
            (event,) = [
                found
                for found in retried.get_asset_materialization_events()
                if found.asset_key == trained_model.key
            ]
            metadata = {
                key: getattr(value, "value", value)
                for key, value in event.materialization.metadata.items()
            }
            runs = client.search_runs(
                [client.get_experiment_by_name(settings["experiment"]).experiment_id]
            )
            history = client.get_metric_history(metadata["mlflow_run_id"], VAL_LOSS)
            versions = registered_model_versions(postgres)
        registered_model = load_training_config()["mlflow"]["registered_model"]
    assert retried.success
    assert metadata["resumed_from_epoch"] >= 1  # from the checkpoint, not from scratch
    assert [run.info.run_id for run in runs] == [metadata["mlflow_run_id"]]  # the same run
    assert sorted({point.step for point in history}) == [0, 1, 2, 3]
    assert versions == [(registered_model, 1, metadata["mlflow_run_id"])]
    assert str(metadata["model_version"]) == "1"
