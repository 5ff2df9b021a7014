"""MLflow side of deployment: the network in, the ONNX and engine hashes back on its version.

The registered model version is the candidate's identity (docs/loop.md); whatever deployment
produces is recorded on it as tags so the registry alone tells which files belong to a version.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ONNX_ARTIFACT_PATH = "onnx"


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def log_onnx(
    tracking_uri: str,
    lineage: Mapping[str, Any],
    onnx_bytes: bytes,
    sha256: str,
    file_name: str = "fp32.onnx",
) -> str:
    """Log the ONNX beside the model in its MLflow run; tag the version with its hash.

    Returns the artifact URI (``runs:/<run>/onnx/<file>``).
    """
    client = _client(tracking_uri)
    run_id = str(lineage["mlflow_run_id"])
    with tempfile.TemporaryDirectory(prefix="aiinfra-onnx-") as directory:
        path = Path(directory) / file_name
        path.write_bytes(onnx_bytes)
        client.log_artifact(run_id, str(path), artifact_path=ONNX_ARTIFACT_PATH)
    uri = f"runs:/{run_id}/{ONNX_ARTIFACT_PATH}/{file_name}"
    tag_version(tracking_uri, lineage, {"onnx_sha256": sha256, "onnx_artifact": uri})
    return uri


def tag_version(tracking_uri: str, lineage: Mapping[str, Any], tags: Mapping[str, str]) -> None:
    client = _client(tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(
            str(lineage["registered_model"]), str(lineage["model_version"]), key, str(value)
        )


def version_tags(tracking_uri: str, registered_model: str, version: str) -> dict[str, str]:
    return dict(_client(tracking_uri).get_model_version(registered_model, version).tags)
