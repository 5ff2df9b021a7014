"""The services a shared deployment runs on, started as real processes on loopback ports.

Postgres (the machine image's Postgres binaries: ``initdb``, ``pg_ctl``), moto's S3 in server
mode (``moto_server``, from the ``moto[server]`` dev extra) and an MLflow tracking server
(``mlflow server``, backend store on that Postgres, artifacts in that S3). Each context manager
starts one process on a free port, waits until it answers, and stops it again by the pid (or
process group) it started — never by name, so parallel sessions on one machine are untouched.
Tests that use them are marked ``services`` (pyproject).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_USER = "dagster"
MLFLOW_DATABASE = "mlflow"  # MLflow's own database: it and Dagster both have a `runs` table
PG_PASSWORD = "pg-password-from-secret"
# moto accepts any credentials; clients (boto3, MLflow's S3 artifact repository) need some.
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (on PATH, else the newest Debian layout)."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


def stop_process_group(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM the process group led by ``process`` (started with ``start_new_session``), then
    SIGKILL what is left; the group id is the pid we started, so only our processes are hit."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers that outlived their parent
    process.wait(timeout=timeout_s)


def wait_for_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; fail with the process's log if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{url} exited ({process.returncode}): {log.read_text()[-3000:]}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(url, timeout=5) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {timeout_s}s: {log.read_text()[-3000:]}")


@dataclass
class Postgres:
    """A throw-away Postgres server (started by ``postgres_server``)."""

    bindir: Path
    root: Path
    port: int
    as_user: list[str]
    host: str = "127.0.0.1"
    user: str = PG_USER
    password: str = PG_PASSWORD

    @property
    def data(self) -> Path:
        return self.root / "data"

    def dagster_env(self, database: str = "postgres") -> dict[str, str]:
        """What ``dagster.yaml``'s ``env:`` keys read (as the Helm chart sets them)."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": database,
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
        }

    def url(self, database: str) -> str:
        # SQLAlchemy >= 2.1 maps a bare postgresql:// to psycopg 3: name psycopg2 (installed).
        return (
            f"postgresql+psycopg2://{self.user}:{self.password}@{self.host}:{self.port}/{database}"
        )

    def connect(self, database: str = "postgres"):
        import psycopg2

        return psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=database,
        )

    def create_database(self, name: str) -> None:
        connection = self.connect()
        connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def pid(self) -> int:
        """The postmaster's pid (first line of ``postmaster.pid``)."""
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", str(self.root / "log"),
            "-o", f"-p {self.port} -k {self.root} -c listen_addresses={self.host}", "start",
        )  # fmt: skip

    def stop(self, timeout_s: float = 60) -> None:
        """Fast shutdown by pid (SIGINT: clients disconnected, in-flight transactions rolled
        back), waiting until the postmaster is gone."""
        if not (self.data / "postmaster.pid").is_file():
            return
        pid = self.pid()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown

    def _run(self, tool: str, *args: str) -> None:
        command = [*self.as_user, str(self.bindir / tool), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            pytest.fail(f"{tool} failed: {done.stdout[-1000:]} {done.stderr[-1000:]}")


def registered_model_versions(postgres: Postgres) -> list[tuple[str, int, str]]:
    """(name, version, run id) of every model version, oldest first, read from MLflow's own
    database: the registry as stored, whether or not the MLflow server is up."""
    connection = postgres.connect(MLFLOW_DATABASE)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, version, run_id FROM model_versions ORDER BY version")
            return cursor.fetchall()
    finally:
        connection.close()


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A Postgres server on a free loopback port (initdb as user ``postgres`` when root, since
    initdb refuses root); skipped where the server binaries are not installed."""
    bindir = postgres_bin()
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
    server = Postgres(bindir=bindir, root=root, port=free_port(), as_user=as_user)
    password_file = root / "pwfile"
    password_file.write_text(server.password)
    if as_user:
        shutil.chown(password_file, user="postgres")
    try:
        server._run(
            "initdb", "-D", str(server.data), "-U", server.user, "-A", "md5",
            f"--pwfile={password_file}",
        )  # fmt: skip
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """moto's S3 as its own process (``moto_server``) on a free loopback port; yields the
    endpoint URL. A separate process, unlike ``http_fakes.moto_s3``'s thread, so it keeps
    answering while the test process waits on a subprocess."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1"]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for_http(f"{endpoint}/moto-api/", process, log, START_TIMEOUT_S)
        yield endpoint
    finally:
        stop_process_group(process)


@dataclass(frozen=True)
class MlflowServer:
    """A running ``mlflow server``: its tracking URI and the process (a group leader)."""

    uri: str
    process: subprocess.Popen

    def crash(self) -> None:
        """SIGKILL the server's whole process group: unreachable at once, as after a crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)


@contextlib.contextmanager
def mlflow_server(
    backend_store_uri: str,
    artifacts_destination: str,
    s3_endpoint: str,
    log: Path,
    port: int | None = None,
) -> Iterator[MlflowServer]:
    """``mlflow server`` on ``port`` (default: a free loopback port).

    Runs and the model registry in ``backend_store_uri`` (Postgres); artifacts of experiments
    created without an artifact location are proxied (``--serve-artifacts``) to
    ``artifacts_destination`` on the S3 endpoint. Experiments created with an ``s3://``
    location (prod.yaml / ci.yaml ``mlflow.artifact_location``) are uploaded by the client
    itself, as in production.
    """
    port = port or free_port()
    command = [
        str(Path(sys.executable).with_name("mlflow")), "server",
        "--backend-store-uri", backend_store_uri,
        "--serve-artifacts", "--artifacts-destination", artifacts_destination,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, **S3_CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint}
    with log.open("a") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        uri = f"http://127.0.0.1:{port}"
        wait_for_http(f"{uri}/health", process, log, START_TIMEOUT_S)
        yield MlflowServer(uri, process)
    finally:
        stop_process_group(process)


@dataclass(frozen=True)
class Services:
    """Postgres, moto's S3 and an MLflow tracking server, as ``running_services`` started them."""

    postgres: Postgres
    s3_endpoint: str
    tracking_uri: str

    def s3(self, endpoint: str | None = None):
        """A boto3 S3 client on ``endpoint`` (default: moto's)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.s3_endpoint,
            region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def env(self) -> dict[str, str]:
        """What a ci deployment's processes get from their environment (secrets included)."""
        return {
            **self.postgres.dagster_env(),
            **S3_CREDENTIALS,
            "AIINFRA_ENV": "ci",
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint,
        }


@contextlib.contextmanager
def running_services(logs: Path, bucket: str) -> Iterator[Services]:
    """Postgres, moto's S3 (with ``bucket``) and ``mlflow server`` on them; logs under ``logs``.

    MLflow's backend store is the database ``MLFLOW_DATABASE`` on the same Postgres; artifacts
    it proxies go to ``s3://<bucket>/proxied``.
    """
    logs.mkdir(parents=True, exist_ok=True)
    with postgres_server() as postgres, moto_server(logs / "moto.log") as s3_endpoint:
        postgres.create_database(MLFLOW_DATABASE)
        Services(postgres, s3_endpoint, "").s3().create_bucket(Bucket=bucket)
        with mlflow_server(
            postgres.url(MLFLOW_DATABASE),
            f"s3://{bucket}/proxied",
            s3_endpoint,
            logs / "mlflow.log",
        ) as server:
            yield Services(postgres, s3_endpoint, server.uri)
