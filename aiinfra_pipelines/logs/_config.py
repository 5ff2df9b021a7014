"""Typed access to ``resources/logs.yaml`` so a missing key fails loudly, naming the file."""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.config import load_resource_yaml

CONFIG_FILE = "logs.yaml"


def section(name: str) -> dict[str, Any]:
    """One top-level section of logs.yaml (``writer``, ``reader``, ``validation``, ...)."""
    loaded = load_resource_yaml(CONFIG_FILE).get(name)
    if not isinstance(loaded, dict):
        raise ValueError(f"resources/{CONFIG_FILE}: missing or invalid section '{name}'")
    return loaded


def setting(section_name: str, key: str) -> Any:
    """A single value, with an error that tells the operator which key to add."""
    values = section(section_name)
    if key not in values:
        raise ValueError(f"resources/{CONFIG_FILE}: missing '{section_name}.{key}'")
    return values[key]
