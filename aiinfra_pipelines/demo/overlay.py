"""The demo's copy of ``resources/``: the production configuration with ``demo.yaml`` overlays.

A six-car demo fleet cannot exercise percentage cohorts meant for thousands of cars, and two
cycles must fit in minutes. Rather than demo switches in the code, the demo writes a patched
copy of the configuration and points ``AIINFRA_RESOURCES`` (its own process and the daemon's)
at it, so every layer runs unchanged and the overlay file says exactly what differs.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from aiinfra_pipelines.config import resources_dir

from .settings import DEMO_CONFIG, DemoSettings


def deep_merge(base: Any, overlay: Any) -> Any:
    """``overlay`` merged into ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        merged = dict(copy.deepcopy(base))
        for key, value in overlay.items():
            merged[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(overlay)


def write_demo_resources(target: Path, overlays: Mapping[str, Any]) -> Path:
    """Copy the configuration to ``target`` and apply ``overlays`` (file name → patch)."""
    source = resources_dir()
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    for name, patch in overlays.items():
        path = target / name
        if not path.is_file():
            raise FileNotFoundError(f"{DEMO_CONFIG} overlays {name!r}, which {source} lacks")
        original = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        path.write_text(
            f"# demo copy: {DEMO_CONFIG} overlays applied\n"
            + yaml.safe_dump(deep_merge(original, patch), sort_keys=False),
            encoding="utf-8",
        )
    return target


def use_demo_resources(home: Path) -> Path:
    """Write the demo configuration under ``home/demo/resources`` and select it for this
    process and every process it starts (the daemon inherits the environment)."""
    target = write_demo_resources(home / "demo" / "resources", DemoSettings.load().overlays)
    os.environ["AIINFRA_RESOURCES"] = str(target)
    return target
