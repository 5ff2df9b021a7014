"""Access to the configuration under ``resources/``.

Thresholds, trigger rules and environment settings are data, not code: every module reads them
through this one loader so an operator can change a gate without touching Python.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resources_dir() -> Path:
    """The configuration folder; ``AIINFRA_RESOURCES`` overrides it (tests, deployments)."""
    return Path(os.environ.get("AIINFRA_RESOURCES", PROJECT_ROOT / "resources"))


def dagster_home() -> Path:
    """``DAGSTER_HOME``, defaulting to the repository's ``dagster_home/``."""
    return Path(os.environ.get("DAGSTER_HOME", PROJECT_ROOT / "dagster_home"))


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime: float) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        loaded = yaml.safe_load(handle) or {}
    if not isinstance(loaded, dict):
        raise ValueError(
            f"{path}: expected a mapping at the top level, got {type(loaded).__name__}"
        )
    return loaded


def load_resource_yaml(relative_path: str) -> dict[str, Any]:
    """Load ``resources/<relative_path>`` as a mapping, with a clear error when it is missing."""
    path = resources_dir() / relative_path
    if not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    return _load_cached(str(path), path.stat().st_mtime)
