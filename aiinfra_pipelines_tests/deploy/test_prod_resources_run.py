"""A Dagster run on the *prod* resources (``build_resources("prod")``) with fake secrets.

lakeFS is a scripted API server that relays its S3 gateway paths to moto (as a real lakeFS
serves both on one host); MLflow tracks to a sqlite file with its artifact root on moto S3.
The run writes an object through the gateway and logs an MLflow artifact to S3; a second run
hits an authentication failure. Afterwards every byte Dagster persisted (run and event-log
storage, compute logs, MLflow's store) is searched for the secrets: none may appear, nor in
the resources' ``repr``/``str`` or the failure's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import mlflow
import pytest

from aiinfra_pipelines.environment import build_resources, load_environment
from aiinfra_pipelines.lake import LakeAuthError, VersionedLake
from aiinfra_pipelines.training.resources import MlflowTracking, mlflow_tracking_uri
from aiinfra_pipelines_tests.support.http_fakes import FakeLakeFS, Reply, moto_s3, serve

LAKE_SECRET = "lakefs-secret-7Hq2-never-persisted"
LAKE_KEY_ID = "AKIALAKEFSPRODTEST01"
AWS_SECRET = "aws-secret-X9v4-never-persisted"
ANON_KEY = "5e" * 32
SECRETS = (LAKE_SECRET, AWS_SECRET, ANON_KEY)
REPO_API = "/api/v1/repositories/drive-data"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with moto_s3() as url:
        raw = boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x",
            aws_secret_access_key="y",
        )  # fmt: skip
        prod_mlflow = load_environment("prod")["mlflow"]["artifact_location"]
        raw.create_bucket(Bucket="drive-data")  # lakeFS gateway: bucket = repository
        raw.create_bucket(Bucket=prod_mlflow.removeprefix("s3://").split("/", 1)[0])
        yield url


@pytest.fixture
def lakefs(s3: str) -> Iterator[FakeLakeFS]:
    api = FakeLakeFS(gateway_upstream=s3)
    api.route(
        "GET",
        f"{REPO_API}/refs/main/objects/stat",
        then=Reply(
            200,
            {
                "path": "probe/data.bin",
                "path_type": "object",
                "physical_address": "s3://aiinfra-drive-data/data/x",
                "checksum": "5d41402abc4b2a76b9719d911017c592",
                "size_bytes": 5,
                "mtime": 1_700_000_000,
            },
        ),
    )
    api.route("GET", f"{REPO_API}/commits/forbidden", then=Reply(401, {"message": "bad creds"}))
    with serve(api):
        yield api


@pytest.fixture
def prod_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3: str, lakefs: FakeLakeFS):
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        "DAGSTER_HOME": str(home),
        "LAKEFS_ENDPOINT": lakefs.url,
        "LAKEFS_ACCESS_KEY_ID": LAKE_KEY_ID,
        "LAKEFS_SECRET_ACCESS_KEY": LAKE_SECRET,
        "AIINFRA_ANON_KEY": ANON_KEY,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "MLFLOW_S3_ENDPOINT_URL": s3,
        "AWS_ACCESS_KEY_ID": "AKIAMLFLOWPRODTEST01",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


seen: list[str] = []


@dg.asset
def landed_probe(lake: VersionedLake, mlflow_tracking: MlflowTracking) -> dg.MaterializeResult:
    """What assets do in prod: bytes into the lake, an artifact into MLflow."""
    stat = lake.put_object("main", "probe/data.bin", b"hello")
    with mlflow_tracking_uri(mlflow_tracking.uri()):
        experiment = mlflow.get_experiment_by_name(mlflow_tracking.experiment)
        with mlflow.start_run(experiment_id=experiment.experiment_id) as run:
            mlflow.log_text("checkpoint stand-in", "checkpoints/last.txt")
    seen.extend([repr(lake), str(lake), repr(mlflow_tracking), str(mlflow_tracking)])
    return dg.MaterializeResult(
        metadata={
            "checksum": stat.checksum,
            "mlflow_run_id": run.info.run_id,
            "artifact_uri": run.info.artifact_uri,
            "lake": repr(lake),  # deliberately: a resource's repr must be safe to publish
        }
    )


@dg.asset
def forbidden_probe(lake: VersionedLake) -> None:
    lake.resolve_ref("forbidden")


def _persisted_bytes(root: Path) -> list[tuple[Path, bytes]]:
    return [(path, path.read_bytes()) for path in root.rglob("*") if path.is_file()]


@pytest.mark.slow
@pytest.mark.services  # moto's S3 server
def test_a_prod_run_stores_no_secret_anywhere(prod_env: Path, lakefs: FakeLakeFS, s3: str):
    seen.clear()
    resources = build_resources("prod")
    with dg.instance_for_test(temp_dir=str(prod_env / "dagster_home")) as instance:
        ok = dg.materialize([landed_probe], instance=instance, resources=resources)
        assert ok.success
        failed = dg.materialize(
            [forbidden_probe], instance=instance, resources=resources, raise_on_error=False
        )
        assert not failed.success
        error = failed.get_step_failure_events()[0].step_failure_data.error
        while error.cause is not None and error.cls_name.startswith("Dagster"):
            error = error.cause  # Dagster wraps the user-code error
        assert error.cls_name == "LakeAuthError" and "401" in error.message
        event_text = "".join(
            dg.serialize_value(entry)
            for run in (ok, failed)
            for entry in instance.all_logs(run.run_id)
        )

    metadata = ok.asset_materializations_for_node("landed_probe")[0].metadata
    assert metadata["checksum"].value == "5d41402abc4b2a76b9719d911017c592"
    # The bytes went through lakeFS's S3 gateway path (same host as the API) into the bucket
    # named after the repository, under <branch>/<path>.
    assert ("PUT", "/drive-data/main/probe/data.bin") in lakefs.gateway_requests
    raw = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    assert raw.get_object(Bucket="drive-data", Key="main/probe/data.bin")["Body"].read() == (
        b"hello"
    )
    # MLflow's experiment was created with the configured S3 artifact root, and the artifact
    # is in that bucket.
    artifact_uri = metadata["artifact_uri"].value
    assert artifact_uri.startswith(load_environment("prod")["mlflow"]["artifact_location"])
    bucket, prefix = artifact_uri.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for o in raw.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert keys == [f"{prefix}/checkpoints/last.txt"]

    # The secrets were really in play (the fake server received the lakeFS credentials) ...
    assert any(h.get("Authorization") for _, _, h in lakefs.requests)
    # ... and are nowhere in what Dagster or MLflow persisted, logged or showed.
    for secret in SECRETS:
        assert secret not in event_text
        assert all(secret not in text for text in seen), "resource repr/str"
        for path, content in _persisted_bytes(prod_env):
            assert secret.encode() not in content, f"{secret[:6]}... persisted in {path}"
    assert LAKE_KEY_ID not in event_text
    with pytest.raises(LakeAuthError) as caught:
        resources["lake"].resolve_ref("forbidden")
    assert all(secret not in str(caught.value) for secret in SECRETS)
