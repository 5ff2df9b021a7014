"""Rollout states on the lake: read one, the current one, or all, as :class:`RolloutState`.

Every reader of ``release/rollout/*.json`` (assets, sensors, OTA, demo) goes through here, so
the JSON → value conversion happens in one place and nobody indexes raw state dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiinfra_pipelines.lake.layout import (
    CURRENT_ROLLOUT_KEY,
    MAIN_BRANCH,
    ROLLOUT_PREFIX,
    rollout_state_key,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .rollout_state import RolloutState


def read_state(
    lake: VersionedLake, model_version: str, ref: str = MAIN_BRANCH
) -> RolloutState | None:
    key = rollout_state_key(model_version)
    value = lake.get_json_or_none(ref, key)
    return None if value is None else RolloutState.from_json(value)


def current_version(lake: VersionedLake, ref: str = MAIN_BRANCH) -> str | None:
    """The model version ``current.json`` names (the rollout the fleet follows), or ``None``."""
    if not lake.object_exists(ref, CURRENT_ROLLOUT_KEY):
        return None
    return str(lake.get_json(ref, CURRENT_ROLLOUT_KEY)["model_version"])


def read_current(lake: VersionedLake, ref: str = MAIN_BRANCH) -> RolloutState | None:
    """The rollout the fleet follows (``current.json``'s state), or ``None``."""
    version = current_version(lake, ref)
    return read_state(lake, version, ref) if version is not None else None


def list_states(lake: VersionedLake, ref: str = MAIN_BRANCH) -> list[RolloutState]:
    """Every rollout state on ``ref`` (``current.json`` excluded), by model version."""
    states = [
        RolloutState.from_json(lake.get_json(ref, stat.key))
        for stat in lake.list_objects(ref, prefix=ROLLOUT_PREFIX)
        if stat.key.endswith(".json") and stat.key != CURRENT_ROLLOUT_KEY
    ]
    return sorted(states, key=lambda s: version_order(s.model_version))


def version_order(model_version: str) -> tuple[int, str]:
    """Sort key for registry versions ("2" < "10"), tolerant of non-numeric ids."""
    text = str(model_version)
    return (int(text), text) if text.isdigit() else (-1, text)


def active_rollout(states: Sequence[RolloutState]) -> str | None:
    """The model version whose rollout is installed on part of the fleet, if any."""
    active = [s for s in states if s.is_active]
    return active[-1].model_version if active else None
