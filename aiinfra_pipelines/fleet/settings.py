"""Access to ``resources/fleet.yaml`` for the fleet modules.

Every fleet function takes an optional ``config`` mapping (the parsed fleet.yaml). ``None`` means
"the deployed file", so production code passes nothing, while tests pass a shrunken copy built
with :func:`with_overrides` instead of monkeypatching module constants.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml

FLEET_CONFIG_FILE = "fleet.yaml"

FleetConfig = Mapping[str, Any]


def fleet_config(config: FleetConfig | None = None) -> FleetConfig:
    """The given config, or the deployed ``resources/fleet.yaml`` when ``None``."""
    return load_resource_yaml(FLEET_CONFIG_FILE) if config is None else config


def with_overrides(config: FleetConfig | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with ``overrides`` merged in recursively (mappings only).

    The cached YAML is never mutated: the loader's cache is shared by the whole process.
    """
    merged: dict[str, Any] = copy.deepcopy(dict(fleet_config(config)))
    _merge_into(merged, overrides)
    return merged


def _merge_into(target: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def frame_rate_hz(config: FleetConfig | None = None) -> float:
    """Recording rate: one frame per highway-env policy step."""
    return float(fleet_config(config)["simulation"]["policy_frequency_hz"])
