"""The registry side: a trained run becomes one model version (the candidate's identity), and
deployment records the ONNX beside it. On a real MLflow sqlite store."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.deployment.registry import log_onnx, version_tags
from aiinfra_pipelines.training.resources import load_registered_network, mlflow_tracking_uri
from aiinfra_pipelines.training.tracking import register_model_version


@pytest.fixture
def logged_runs(tmp_path, network):
    """Two MLflow runs that each logged the network as the training asset does (pickle)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = []
    with mlflow_tracking_uri(uri):
        experiment = mlflow.create_experiment("perception", (tmp_path / "artifacts").as_uri())
        for _ in range(2):
            with mlflow.start_run(experiment_id=experiment) as run:
                info = mlflow.pytorch.log_model(
                    network, name="model", serialization_format="pickle", pip_requirements=[]
                )
                runs.append((run.info.run_id, info.model_uri))
    return uri, runs


def test_each_run_is_one_version_with_lineage_tags_and_the_candidate_alias(logged_runs):
    uri, [(first_run, first_uri), (second_run, second_uri)] = logged_runs
    lineage = {"dataset_commit": "c0ffee", "dataset_version": "dataset-v0001", "code_version": "g1"}
    first = register_model_version(uri, first_uri, first_run, {**lineage, "dagster_run_id": "d1"})
    again = register_model_version(uri, first_uri, first_run, {**lineage, "dagster_run_id": "d2"})
    assert first.registered_model == "perception" and first.version == again.version == "1"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert len(client.search_model_versions("name = 'perception'")) == 1  # no duplicate
    tags = version_tags(uri, "perception", "1")
    assert tags["dataset_commit"] == "c0ffee" and tags["dagster_run_id"] == "d2"
    assert client.get_model_version("perception", "1").run_id == first_run

    second = register_model_version(uri, second_uri, second_run, lineage)
    assert second.version == "2"
    assert str(client.get_model_version_by_alias("perception", "candidate").version) == "2"


def test_the_onnx_is_logged_beside_the_model_and_hashed_on_its_version(logged_runs, exported):
    uri, [(run_id, model_uri), _] = logged_runs
    version = register_model_version(uri, model_uri, run_id, {"dataset_commit": "c0ffee"})
    lineage = {
        "mlflow_run_id": run_id,
        "registered_model": version.registered_model,
        "model_version": version.version,
    }
    artifact = log_onnx(uri, lineage, exported.onnx_bytes, exported.sha256)
    assert artifact == f"runs:/{run_id}/onnx/fp32.onnx"
    client = MlflowClient(tracking_uri=uri)
    assert [a.path for a in client.list_artifacts(run_id, "onnx")] == ["onnx/fp32.onnx"]
    assert version_tags(uri, "perception", version.version)["onnx_sha256"] == exported.sha256
    network = load_registered_network(model_uri, uri)
    assert type(network).__name__ == "PerceptionNet"
