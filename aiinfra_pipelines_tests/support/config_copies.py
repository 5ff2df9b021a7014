"""Tests that need a setting changed run on a copy of ``resources/`` with overlays applied.

The same deep merge as the demo's overlays (``demo.overlay``), so a test's change reads like a
``demo.yaml`` overlay and nothing in the repository's configuration is touched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.demo.overlay import deep_merge

# Loop-mechanics tests train their first candidate on a handful of drives: what they check is
# lineage, publishing and deployment, not whether such a model beats the no-camera baselines
# (the first-release gate has its own tests). They lift the floors in their copy.
WITHOUT_FIRST_RELEASE_FLOORS: Mapping[str, Any] = {
    "gates.yaml": {"offline": {"first_release": None}}
}


@contextmanager
def resources_with(folder: Path, overlays: Mapping[str, Any]) -> Iterator[Path]:
    """``AIINFRA_RESOURCES`` points at a copy of the configuration with ``overlays`` merged."""
    shutil.copytree(resources_dir(), folder)
    for name, patch in overlays.items():
        path = folder / name
        path.write_text(yaml.safe_dump(deep_merge(yaml.safe_load(path.read_text()), patch)))
    previous = os.environ.get("AIINFRA_RESOURCES")
    os.environ["AIINFRA_RESOURCES"] = str(folder)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("AIINFRA_RESOURCES", None)
        else:
            os.environ["AIINFRA_RESOURCES"] = previous
