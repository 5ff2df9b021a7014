"""Where experiments are tracked and checkpoints are kept."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from aiinfra_pipelines.config import dagster_home


class MlflowTracking(dg.ConfigurableResource):
    """MLflow tracking: a server via ``MLFLOW_TRACKING_URI`` in shared environments, otherwise
    a sqlite store under ``DAGSTER_HOME`` (artifacts beside it)."""

    tracking_uri: str = ""
    experiment: str = "perception"
    checkpoint_root: str = ""

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
