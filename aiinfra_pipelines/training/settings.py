"""``resources/training.yaml`` as the nested mapping training runs on, and its MLflow params.

The training recipe stays a mapping (not a dataclass) on purpose: every key is a hyperparameter
that is logged to MLflow verbatim (``flatten_params``) and compared on resume, and partial
overrides (tests, the asset's run config, the environment) merge into it section by section.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml

CONFIG_FILE = "training.yaml"


def _deep_merge(
    base: dict[str, Any], overrides: Mapping[str, Any], path: str = ""
) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in; a key ``base`` does not have is a typo: refuse it."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if key not in base:
            raise ValueError(f"unknown training config key {path}{key!r} (not in {CONFIG_FILE})")
        if isinstance(value, Mapping) and isinstance(base[key], dict):
            merged[key] = _deep_merge(base[key], value, f"{path}{key}.")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_training_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``resources/training.yaml`` with ``overrides`` merged in section by section.

    Overrides are partial (``{"data": {"num_workers": 0}}`` keeps the other data settings), so
    tests and the asset's run config change one knob without restating the file; a key the
    file does not define raises ``ValueError`` instead of being silently ignored.
    """
    return _deep_merge(load_resource_yaml(CONFIG_FILE), overrides or {})


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → MLflow params ``section.key = value`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat
