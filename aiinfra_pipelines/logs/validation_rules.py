"""Validation thresholds: logs.yaml's ``validation`` section, optionally overridden.

Its own module because every check group and the index-only ingest path resolve rules the
same way, and none of them should depend on another to do it.
"""

from __future__ import annotations

import copy
from typing import Any

from aiinfra_pipelines.logs import _config


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_rules(rules: dict[str, Any] | None = None) -> dict[str, Any]:
    """logs.yaml's ``validation`` section with ``rules`` merged over it (tests, experiments).

    Merging rather than replacing lets a caller tighten one threshold without restating all.
    """
    return _deep_merge(_config.section("validation"), rules or {})
