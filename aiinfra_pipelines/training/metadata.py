"""Dagster metadata of ``trained_model``: what an operator checks before trusting a model."""

from __future__ import annotations

from typing import Any

import dagster as dg

from .training_run import TrainedModel


def trained_model_metadata(model: TrainedModel) -> dict[str, Any]:
    """Registry version, lineage, epochs and validation metrics (-1: not resumed)."""
    identity = model.identity
    return {
        "registered_model": identity.registered_model,
        "model_version": identity.model_version,
        "mlflow_run_id": identity.mlflow_run_id,
        "dataset_version": identity.dataset_version,
        "dataset_commit": identity.dataset_commit,
        "epochs": model.epochs,
        "warm_start_from": model.warm_start_from,
        "distilled_from": model.distilled_from,
        "transfer_frames": model.transfer_frames,
        "resumed_from_epoch": model.resumed_from_epoch
        if model.resumed_from_epoch is not None
        else -1,
        "metrics": dg.MetadataValue.json(model.metrics),
    }
