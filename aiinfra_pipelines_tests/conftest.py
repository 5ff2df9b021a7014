"""Shared fixtures: an isolated DAGSTER_HOME, a LocalLake on disk, resources, an instance."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# Rich reads COLUMNS once, when the CLI's console is created at import, and keeps that width
# for good (pytest-xdist, for one, starts its workers with COLUMNS=80). Unset, the console
# reads it on every print, so a test's monkeypatch.setenv("COLUMNS", ...) always widens it.
os.environ.pop("COLUMNS", None)


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def local_lake(tmp_path: Path):
    from aiinfra_pipelines.lake.local import LocalLake

    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    return lake


@pytest.fixture
def ingest_resources(local_lake) -> dict:
    from aiinfra_pipelines.ingest.resources import AnonymizationKey
    from aiinfra_pipelines.lake.io_manager import LakeIOManager

    return {
        "lake": local_lake,
        "io_manager": LakeIOManager(lake=local_lake),
        "anonymization": AnonymizationKey(key_hex="ab" * 32),
    }


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test(temp_dir=str(dagster_home)) as test_instance:
        yield test_instance
