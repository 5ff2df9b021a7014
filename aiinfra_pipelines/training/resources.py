"""Where experiments are tracked and checkpoints are kept."""

from __future__ import annotations

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
