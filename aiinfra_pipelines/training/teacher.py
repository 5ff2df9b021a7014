"""The cloud teacher: a larger network trained where compute is cheap, distilled into the car's.

The car's network is sized to the car's budget (``deployment.yaml``); the teacher is not. It
trains on the same dataset version with the same recipe, only wider (``training.yaml``
``teacher``), is registered as a model of its own, and the student learns from its readings
(``training.yaml`` ``distillation``). Each cycle's teacher grows from the previous cycle's
teacher, as the student grows from the release.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.perception.network import PerceptionNet

from .settings import load_training_config


@dataclass(frozen=True)
class Teacher:
    """A trained teacher network and what names it (recorded as the student's
    ``distilled_from`` param, so a student's lineage includes the teacher it learned from)."""

    network: PerceptionNet
    source: str


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Two partial override mappings as one (``extra`` wins, section by section)."""
    merged = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def teacher_overrides(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Overrides of ``training.yaml`` that train the teacher instead of the student.

    ``overrides`` are the student's (environment, run config): the teacher runs on the same
    hardware settings, with ``teacher``'s architecture, epochs and registered model, and no
    teacher of its own.
    """
    section = load_training_config(overrides)["teacher"]
    return _merged(
        overrides or {},
        {
            "model": dict(section["model"]),
            "max_epochs": int(section["max_epochs"]),
            "mlflow": {"registered_model": str(section["registered_model"])},
            "distillation": {"enabled": False},
        },
    )


def distillation_enabled(overrides: Mapping[str, Any] | None = None) -> bool:
    """``training.yaml`` ``distillation.enabled`` after ``overrides``."""
    return bool(load_training_config(overrides)["distillation"]["enabled"])


def load_teacher(model_uri: str, version: str, tracking_uri: str) -> Teacher:
    """The registered teacher network, frozen, named by its URI and version."""
    from .resources import load_registered_network

    network = load_registered_network(model_uri, tracking_uri)
    return Teacher(network.eval(), f"{model_uri} (teacher version {version})")
