"""The whole loop, twice, through the real ``dagster-daemon`` — with the daemon killed mid-loop.

Cycle 1: a tiny fleet lands logs and telemetry; the daemon's sensors ingest, mine, retrain,
export, quantize, simulate, certify, shadow, start the canary and sign OTA metadata. While the
training run is in flight the daemon is killed (SIGKILL, a crash) and started again: no work
may be lost and no run launched twice. Cycle 2: the cars in the canary cohort drive with the
new engine (their logs say so) and the rollout decides on their fresh telemetry.

This is the demo's code path (``aiinfra_pipelines.demo``) with the daemon restart in between;
slow (several minutes on 2 cores) but run in CI.
"""

from __future__ import annotations

import collections
import shutil
import signal
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from rich.console import Console

from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.demo import corrupt_copy, published_partitions
from aiinfra_pipelines.demo.daemon import DaemonProcess
from aiinfra_pipelines.demo.fleet_cycle import (
    CANDIDATE,
    batch_name,
    drive_and_upload,
    engine_name,
    fleet_assignment,
)
from aiinfra_pipelines.demo.overlay import demo_settings, write_demo_resources
from aiinfra_pipelines.demo.waiting import (
    Deadline,
    wait_for_ingest,
    wait_for_mining,
    wait_for_telemetry,
    wait_until_quiet,
)
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.ingest.partitions import LogLocation
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, RUN_BRANCH_PREFIX
from aiinfra_pipelines.release.rollout import read_current

pytestmark = pytest.mark.slow

VEHICLES, EPISODES, SEED = 4, 2, 11
RUN_KEY_TAG = "dagster/run_key"
DECISIONS = {"stage_started", "rolled_back", "awaiting_approval", "healthy"}


@pytest.fixture
def loop_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    resources = write_demo_resources(tmp_path / "resources", demo_settings()["overlays"])
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("AIINFRA_RESOURCES", str(resources))
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    return home


def _upload(lake, cycle: int, console: Console):
    assignment = fleet_assignment(lake)
    upload = drive_and_upload(
        lake,
        assignment,
        vehicles=VEHICLES,
        episodes=EPISODES,
        seed=SEED + cycle,
        batch_id=batch_name(cycle, SEED),
        faulty_logs=1 if cycle == 1 else 0,
        corrupt=corrupt_copy,
        console=console,
    )
    partitions = [
        LogLocation(branch=upload.logs.branch, key=key).partition_key for key in upload.logs.keys
    ]
    return assignment, upload, partitions


def _feed(instance, lake, daemon, upload, partitions, deadline, console) -> None:
    runs = wait_for_ingest(instance, partitions, daemon, deadline, console)
    wait_for_mining(instance, published_partitions(instance, runs), daemon, deadline, console)
    wait_for_telemetry(instance, upload.telemetry.branch, daemon, deadline, console)


def _wait_for_training_in_flight(instance, daemon, deadline) -> dg.DagsterRun:
    while not deadline.expired():
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="training_cycle"), limit=1)
        if runs and runs[0].status == dg.DagsterRunStatus.STARTED:
            return runs[0]
        assert not runs or runs[0].status != dg.DagsterRunStatus.FAILURE
        daemon.require_alive()
        time.sleep(1.0)
    raise TimeoutError("no training run started")


def _sensor_runs(instance) -> list[dg.DagsterRun]:
    """Runs a sensor launched, without the daemon's automatic re-executions of failed runs."""
    return [
        run for run in instance.get_runs() if RUN_KEY_TAG in run.tags and run.parent_run_id is None
    ]


def test_two_cycles_through_the_daemon_survive_a_daemon_crash(loop_home: Path, tmp_path: Path):
    console = Console(file=(tmp_path / "console.txt").open("w"), width=160)
    instance = dg.DagsterInstance.get()
    instance.event_log_storage.set_concurrency_slots("gpu", 1)
    lake = build_lake(load_environment())
    lake.ensure_repository()
    deadline = Deadline.after(1500)
    daemon_log = loop_home / "daemon.log"

    # -- cycle 1, with the daemon killed while the training run is in flight -------------------
    assignment, upload, partitions = _upload(lake, 1, console)
    assert assignment.candidate is None and assignment.production is None  # nothing released
    with DaemonProcess(daemon_log) as daemon:
        _feed(instance, lake, daemon, upload, partitions, deadline, console)
        training = _wait_for_training_in_flight(instance, daemon, deadline)
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(timeout=30)
    with DaemonProcess(loop_home / "daemon-restarted.log") as daemon:
        wait_until_quiet(instance, lake, daemon, deadline, console, settle_s=6)

    assert instance.get_run_by_id(training.run_id).status == dg.DagsterRunStatus.SUCCESS
    trainings = instance.get_runs(filters=dg.RunsFilter(job_name="training_cycle"))
    assert [run.run_id for run in trainings] == [training.run_id]  # not launched again
    keys = collections.Counter(run.tags[RUN_KEY_TAG] for run in _sensor_runs(instance))
    assert [key for key, count in keys.items() if count > 1] == []
    # Every landed log has exactly one ingest run (the truncated one quarantined, not lost).
    for partition in partitions:
        ingest_runs = [
            run
            for run in instance.get_runs(
                filters=dg.RunsFilter(tags={"dagster/partition": partition})
            )
            if run.parent_run_id is None and "lakefs_ingest_sensor" in run.job_name
        ]
        assert len(ingest_runs) == 1, partition
    # The candidate went all the way: certified, shadowed, canary started, OTA signed.
    assert lake.object_exists(MAIN_BRANCH, "candidates/1/certificate.json")
    state = read_current(lake)
    assert state is not None and state["model_version"] == "1"
    assert state["status"] == "in_progress" and state["stage"] == "canary"
    assert lake.object_exists(MAIN_BRANCH, "ota/metadata/timestamp.json")
    assert lake.list_branches(prefix=RUN_BRANCH_PREFIX) == []  # every run published or empty

    # -- cycle 2: the canary cohort drives with the new engine ----------------------------------
    _raise_retraining_threshold(tmp_path / "resources")  # cycle 2 is about the rollout
    assignment, upload, partitions = _upload(lake, 2, console)
    cohort = {vin for vin, role in assignment.cohort.items() if role == CANDIDATE}
    with DaemonProcess(loop_home / "daemon-cycle2.log") as daemon:
        _feed(instance, lake, daemon, upload, partitions, deadline, console)
        wait_until_quiet(instance, lake, daemon, deadline, console, settle_s=6)

    index = scene_index_view(lake)
    cycle2 = index[index["source_branch"] == upload.logs.branch]
    versions = set(cycle2["software_version"])
    after = read_current(lake) or {}
    last = (after.get("history") or [{}])[-1]
    if cohort and len(cohort) < VEHICLES:
        # Cars in the cohort drove perception-v1; the rollout judged their fresh telemetry.
        assert engine_name("1") in versions
        assert last["event"] in DECISIONS, last
        assert after.get("last_telemetry_commit") != state.get("last_telemetry_commit")
    else:  # the salted cohort took no car (or every car): nothing to compare, the stage waits
        assert last["event"] == "waiting", last
    keys = collections.Counter(run.tags[RUN_KEY_TAG] for run in _sensor_runs(instance))
    assert [key for key, count in keys.items() if count > 1] == []


def _raise_retraining_threshold(resources: Path) -> None:
    path = resources / "loop.yaml"
    loop = yaml.safe_load(path.read_text())
    loop["retraining"]["min_unseen_badcases"] = 10**9
    path.write_text(yaml.safe_dump(loop))
