"""The main job's command, ``aiinfra demo``, for one cycle of a tiny fleet: every stage."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX


@pytest.mark.slow
def test_demo_ingests_a_fleet_batch_through_the_daemon(tmp_path: Path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    aiinfra = Path(sys.executable).with_name("aiinfra")

    result = subprocess.run(
        [
            str(aiinfra),
            "demo",
            "--vehicles",
            "3",
            "--episodes",
            "1",
            "--cycles",
            "1",
            "--seed",
            "3",
            "--timeout-s",
            "900",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "DAGSTER_HOME": str(home), "SDL_VIDEODRIVER": "dummy", "COLUMNS": "200"},
        cwd=PROJECT_ROOT,
        timeout=1200,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = re.search(
        r"logs landed (\d+), accepted (\d+), quarantined (\d+), failed runs (\d+)", result.stdout
    )
    assert summary, result.stdout[-3000:]
    landed, accepted, quarantined, failed = map(int, summary.groups())
    assert (quarantined, failed) == (1, 0)  # the demo's one deliberately truncated upload
    assert accepted == landed - 1 >= 1
    lake = LocalLake(root=str(home / "lake"))
    index = scene_index_view(lake)
    assert index["log_key"].nunique() == accepted
    assert list(quarantine_view(lake)["reason_codes"]) == ["truncated"]
    assert lake.list_branches(prefix=RUN_BRANCH_PREFIX) == []
    # Past ingestion, the summary reports every later stage of the loop from main.
    for line in ("training cycle SUCCESS", "regression simulation model version 1", "rollouts"):
        assert line in result.stdout, result.stdout[-3000:]
    assert re.search(r"certification model version 1: (certified|not certified)", result.stdout)
    assert "demo finished in" in result.stdout
