"""Access to ``resources/mining.yaml``: one place that turns "no config given" into the file.

Functions take ``config: dict | None`` so tests can pass an edited copy while assets use the
operator's file; nothing in the mining code carries a threshold of its own.
"""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.config import load_resource_yaml

MINING_CONFIG_FILE = "mining.yaml"


def mining_config(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``config`` itself when given, else the mining configuration from ``resources/``."""
    return load_resource_yaml(MINING_CONFIG_FILE) if config is None else config
