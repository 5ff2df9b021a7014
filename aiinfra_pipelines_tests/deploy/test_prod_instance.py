"""The production ``dagster.yaml`` as a real instance: Postgres storage, K8sRunLauncher, run
queue, pools, retries and S3 compute logs — everything a cluster has except the cluster.

A throw-away Postgres server (the Debian ``postgresql`` binaries) is started for the module
and stopped afterwards; the test is skipped where they are not installed. The run launcher is
pointed at a kubeconfig file instead of the in-cluster service account (the only change made
to the file); compute logs go to moto's S3.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import pytest
import yaml

from aiinfra_pipelines.config import PROJECT_ROOT, resources_dir
from aiinfra_pipelines_tests.support.http_fakes import moto_s3

pytestmark = pytest.mark.slow

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: test, user: {token: not-a-real-token}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
"""
PG_PASSWORD = "pg-password-from-secret"


def _postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A Postgres server on a free localhost port (initdb as user postgres when root)."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("Postgres server binaries (initdb, pg_ctl) are not installed")
    as_user: list[str] = []
    # Not under pytest's tmp root: that is private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="aiinfra-pg-"))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: initdb refuses root")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, user="postgres")
    data, port = root / "data", _free_port()
    password_file = root / "pwfile"
    password_file.write_text(PG_PASSWORD)
    if as_user:
        shutil.chown(password_file, user="postgres")
    for command in (
        [str(bindir / "initdb"), "-D", str(data), "-U", "dagster", "-A", "md5",
         f"--pwfile={password_file}"],
        [str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(root / "log"),
         "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"],
    ):  # fmt: skip
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail(f"{command[0]} failed: {done.stdout[-1000:]} {done.stderr[-1000:]}")
    try:
        yield {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(port),
            "DAGSTER_PG_DB": "postgres",
            "DAGSTER_PG_USERNAME": "dagster",
            "DAGSTER_PG_PASSWORD": PG_PASSWORD,
        }
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


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
