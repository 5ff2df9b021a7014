"""Where experiments are tracked and checkpoints are kept.

Locally: a sqlite tracking store under ``DAGSTER_HOME`` with artifacts beside it. In prod
(``resources/environments/prod.yaml``): the tracking server named by ``MLFLOW_TRACKING_URI``,
run artifacts (final checkpoint, logged model) on S3 under ``artifact_location`` — the MLflow
client uploads them itself with the ``AWS_*`` credentials and ``MLFLOW_S3_ENDPOINT_URL`` of its
environment — and per-epoch checkpoints on the shared volume ``checkpoint_root`` (a ReadWrite-
Many mount: resuming needs atomic rename and a file lock, which S3 does not offer).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from aiinfra_pipelines.config import dagster_home


class MlflowTracking(dg.ConfigurableResource):
    """MLflow tracking: a server via ``MLFLOW_TRACKING_URI`` in shared environments, otherwise
    a sqlite store under ``DAGSTER_HOME`` (artifacts beside it)."""

    tracking_uri: str = ""
    experiment: str = "perception"
    checkpoint_root: str = ""
    # Artifact root for the experiment when this code creates it (e.g. s3://bucket/perception);
    # empty = the tracking server's default (or beside the sqlite file locally).
    artifact_location: str = ""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Create the experiment with ``artifact_location`` before any step logs to it.

        Runs when a step that uses the resource starts (never at code-location load), and only
        when an artifact location is configured, so local runs stay offline.
        """
        if self.artifact_location:
            location = self.ensure_experiment()
            if location.rstrip("/") != self.artifact_location.rstrip("/"):
                context.log.warning(
                    f"MLflow experiment {self.experiment!r} already exists with artifact "
                    f"location {location!r}, not the configured {self.artifact_location!r}; "
                    "MLflow cannot move it, so its artifacts stay there"
                )

    def ensure_experiment(self) -> str:
        """The experiment's artifact location, creating the experiment (with the configured
        ``artifact_location``) if it does not exist yet; safe against a concurrent creator."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri())
        existing = client.get_experiment_by_name(self.experiment)
        if existing is None:
            with contextlib.suppress(MlflowException):  # or created meanwhile by another step
                client.create_experiment(
                    self.experiment, artifact_location=self.artifact_location or None
                )
            existing = client.get_experiment_by_name(self.experiment)
            if existing is None:
                raise RuntimeError(f"MLflow experiment {self.experiment!r} could not be created")
        return existing.artifact_location

    def uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        folder = dagster_home() / "mlflow"
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{folder / 'mlflow.db'}"

    def checkpoints(self) -> Path:
        """Durable checkpoint storage (shared storage in prod, so a killed run resumes)."""
        root = (
            Path(self.checkpoint_root) if self.checkpoint_root else dagster_home() / "checkpoints"
        )
        root.mkdir(parents=True, exist_ok=True)
        return root


@contextlib.contextmanager
def mlflow_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API at ``uri`` for the block, then restore the caller's setting.

    ``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``; both the module-level
    value and the environment variable are put back, so a training call never changes where
    the caller's own MLflow calls go.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    previous = getattr(tracking_utils, "_tracking_uri", None)
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def load_registered_network(model_uri: str, tracking_uri: str) -> Any:
    """A logged ``PerceptionNet`` on CPU, as MLflow stored it (pickle format loads the module):
    the one way every layer (warm start, teacher, evaluation, deployment) reads a model back."""
    import mlflow

    with mlflow_tracking_uri(tracking_uri):
        return mlflow.pytorch.load_model(model_uri, map_location="cpu")
