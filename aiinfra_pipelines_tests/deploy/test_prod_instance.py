"""The production ``dagster.yaml`` as a real instance: Postgres storage, K8sRunLauncher, run
queue, pools, retries and S3 compute logs — everything a cluster has except the cluster.

A throw-away Postgres server (``support/services.py``: the image's Postgres binaries) is
started for the module and stopped afterwards by pid; the test is skipped where they are not
installed. The run launcher is pointed at a kubeconfig file instead of the in-cluster service
account (the only change made to the file); compute logs go to moto's S3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import pytest
import yaml

from aiinfra_pipelines.config import PROJECT_ROOT, resources_dir
from aiinfra_pipelines_tests.support.http_fakes import moto_s3
from aiinfra_pipelines_tests.support.services import postgres_server

pytestmark = [pytest.mark.slow, pytest.mark.services]

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: test, user: {token: not-a-real-token}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
"""


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A Postgres server on a free localhost port (support/services.py), as DAGSTER_PG_* env."""
    with postgres_server() as server:
        yield server.dagster_env()


@pytest.fixture
def prod_home(
    postgres: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """DAGSTER_HOME holding resources/deploy/dagster.yaml, env as the Helm chart sets it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = yaml.safe_load((resources_dir() / "deploy" / "dagster.yaml").read_text())
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    launcher = config["run_launcher"]["config"]
    launcher["load_incluster_config"] = False
    launcher["kubeconfig_file"] = str(kubeconfig)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with moto_s3() as s3:
        boto3.client(
            "s3", endpoint_url=s3, region_name="us-east-1", aws_access_key_id="x",
            aws_secret_access_key="y",
        ).create_bucket(Bucket="aiinfra-dagster-logs")  # fmt: skip
        env = {
            **postgres,
            "DAGSTER_HOME": str(home),
            "DAGSTER_K8S_JOB_NAMESPACE": "aiinfra",
            "DAGSTER_COMPUTE_LOG_BUCKET": "aiinfra-dagster-logs",
            "DAGSTER_S3_ENDPOINT_URL": s3,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        yield home


def _dagster_cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


@dg.asset
def smoke() -> int:
    return 1


def test_prod_instance_migrates_and_runs_on_postgres(prod_home: Path) -> None:
    from dagster_aws.s3.compute_log_manager import S3ComputeLogManager
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    _dagster_cli("instance", "migrate")  # what the Helm hook (migrate.enabled) runs
    _dagster_cli("instance", "concurrency", "set", "gpu", "4")  # the runbook's one-time step

    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.run_launcher, K8sRunLauncher)
        assert instance.run_launcher.job_namespace == "aiinfra"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert isinstance(instance.compute_log_manager, S3ComputeLogManager)
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_monitoring_enabled
        concurrency = instance.get_concurrency_config()
        assert concurrency.pool_config.default_pool_limit == 8
        limits = {
            (limit["key"], limit.get("value")): limit["limit"]
            for limit in concurrency.run_queue_config.tag_concurrency_limits
        }
        assert limits == {("aiinfra/resource", "gpu"): 4, ("aiinfra/group", "ingest"): 24}
        assert instance.event_log_storage.get_concurrency_info("gpu").slot_count == 4

        result = dg.materialize([smoke], instance=instance)
        assert result.success
        stored = instance.get_run_by_id(result.run_id)
        assert stored is not None and stored.is_success
        assert instance.get_latest_materialization_event(smoke.key) is not None
