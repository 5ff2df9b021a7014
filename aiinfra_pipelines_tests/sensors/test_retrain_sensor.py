"""``retraining_sensor`` against a real lake state: ingested and mined logs, then a dataset."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.datasets.selection import logs_in_use, unseen_badcases
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.sensors.retrain_sensor import (
    TRAINING_JOB,
    decide_retraining,
    retraining_sensor,
)
from aiinfra_pipelines.sensors.settings import RetrainingSettings
from aiinfra_pipelines.training.resources import MlflowTracking
from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
    materialize_per_batch,
)

THRESHOLD = 5


def _low_threshold_resources(folder) -> str:
    """A resources copy whose retraining threshold a few synthetic logs can reach."""
    shutil.copytree(resources_dir(), folder)
    loop = yaml.safe_load((folder / "loop.yaml").read_text())
    loop["retraining"]["min_unseen_badcases"] = THRESHOLD
    (folder / "loop.yaml").write_text(yaml.safe_dump(loop))
    return str(folder)


@pytest.fixture(scope="module")
def module_env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("retrain")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIINFRA_RESOURCES", _low_threshold_resources(workdir / "resources"))
        patch.setenv("DAGSTER_HOME", str(workdir))
        yield workdir


@pytest.fixture
def low_threshold(module_env):
    return module_env


@pytest.fixture(scope="module")
def mined_template(module_env) -> tuple[Path, Path]:
    """Three synthetic logs ingested and mined by model zero (every frame is a badcase), once:
    (Dagster home, lake root). Tests never touch it; each gets its own copy (``mined``)."""
    home, lake_root = module_env / "template-home", module_env / "template-lake"
    home.mkdir()
    lake = LocalLake(root=str(lake_root))
    lake.ensure_repository()
    logs = [make_synthetic_log(n_frames=12, seed=seed, **CAMERA_SIZE) for seed in (1, 2, 3)]
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        ingest_and_mine(instance, loop_resources(lake, module_env), "retrain", logs)
    return home, lake_root


@pytest.fixture
def mined(mined_template, low_threshold, tmp_path):
    """This test's own copy of the mined lake and of the instance that ingested it: (instance,
    lake, resources). What one test does to them (a dataset cut, runs in flight) no other test
    sees, so the module passes in any order."""
    home, lake_root = mined_template
    shutil.copytree(home, tmp_path / "home")
    shutil.copytree(lake_root, tmp_path / "lake")
    lake = LocalLake(root=str(tmp_path / "lake"))
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield instance, lake, loop_resources(lake, tmp_path)


def _tick(instance, lake, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake})
    return retraining_sensor(context)


def test_no_data_means_no_training(instance, local_lake, low_threshold):
    result = _tick(instance, local_lake)
    assert isinstance(result, dg.SkipReason)
    assert "0 unseen" in result.skip_message


def test_unseen_badcases_request_one_training_cycle_with_a_stable_key(mined):
    instance, lake, _ = mined
    unseen = unseen_badcases(lake)
    assert len(unseen) >= THRESHOLD
    first = _tick(instance, lake)
    (request,) = first.run_requests
    assert request.run_key.startswith("retrain-badcases-")
    assert "unseen accepted badcases" in request.tags["aiinfra/trigger"]
    # A repeated tick (or one after a daemon restart, cursor lost) asks for the same key, which
    # the daemon deduplicates: no second training run.
    assert _tick(instance, lake, cursor=first.cursor).run_requests[0].run_key == request.run_key
    assert _tick(instance, lake).run_requests[0].run_key == request.run_key


def test_waits_while_a_training_cycle_is_in_flight(mined):
    instance, lake, _ = mined
    instance.add_run(dg.DagsterRun(job_name=TRAINING_JOB, status=dg.DagsterRunStatus.STARTED))
    result = _tick(instance, lake)
    assert isinstance(result, dg.SkipReason)
    assert "in flight" in result.skip_message


def test_waits_while_logs_are_still_being_ingested_or_mined(mined):
    instance, lake, _ = mined
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            status=dg.DagsterRunStatus.STARTED,
            asset_selection=frozenset({dg.AssetKey("mined_badcases")}),
        )
    )
    result = _tick(instance, lake)
    assert isinstance(result, dg.SkipReason)
    assert "ingest/mining run(s) still in flight" in result.skip_message


def test_decision_rules():
    settings = RetrainingSettings(min_unseen_badcases=3, on_drift=True, interval_s=10)
    empty = pd.DataFrame(columns=["log_id", "frame_index"])
    assert not decide_retraining(empty, None, settings).retrain
    drift = {"drifted": True, "id": "abc", "signals": ["confidence"]}
    decision = decide_retraining(empty, drift, settings)
    assert decision.retrain and decision.run_key == "retrain-drift-abc"
    assert not decide_retraining(empty, drift, replace(settings, on_drift=False)).retrain


def test_drift_in_logs_already_trained_on_starts_no_training():
    """Retraining on the very logs that drifted would learn nothing: drift needs new logs."""
    settings = RetrainingSettings(min_unseen_badcases=3, on_drift=True, interval_s=10)
    empty = pd.DataFrame(columns=["log_id", "frame_index"])
    drift = {
        "drifted": True,
        "id": "abc",
        "signals": ["sharpness"],
        "identity": {"recent_logs": ["log-a", "log-b"]},
    }
    seen = decide_retraining(empty, drift, settings, frozenset({"log-a", "log-b", "log-c"}))
    assert not seen.retrain
    assert "nothing new to retrain on" in seen.reason and "sharpness" in seen.reason
    fresh = decide_retraining(empty, drift, settings, frozenset({"log-a"}))
    assert fresh.retrain and fresh.run_key == "retrain-drift-abc"


def test_a_new_dataset_absorbs_the_badcases_and_the_sensor_goes_quiet(mined):
    """Consumes the unseen badcases, in this test's own copy of the lake."""
    instance, lake, resources = mined
    assert len(unseen_badcases(lake)) >= THRESHOLD
    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("benchmark_set", "training_dataset"),
        instance=instance,
        resources={**resources, "mlflow_tracking": MlflowTracking()},
    )
    assert result.success
    assert unseen_badcases(lake).empty
    assert isinstance(_tick(instance, lake), dg.SkipReason)
    # Every published log is now trained on or held out: drift over them retrains nothing.
    published = set(scene_index_view(lake)["log_id"].astype(str))
    assert published and logs_in_use(lake) == published


def test_waits_for_a_benchmark_before_training_a_first_candidate(low_threshold, tmp_path):
    """Every slice driven once: nothing can be held out, so a candidate could not be scored.

    Training then would only fail at ``offline_eval``; the sensor says why it waits instead,
    and requests the cycle as soon as one slice has a second log.
    """
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    one_per_slice = [
        make_synthetic_log(n_frames=12, seed=seed, **CAMERA_SIZE, road_type=road)
        for seed, road in ((11, "highway"), (12, "merge"))
    ]
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        ingest_and_mine(instance, resources, "singles", one_per_slice)
        assert len(unseen_badcases(lake)) >= THRESHOLD
        waiting = _tick(instance, lake)
        assert isinstance(waiting, dg.SkipReason)
        assert "benchmark would hold no log yet" in waiting.skip_message
        assert "none of the 2 slice(s)" in waiting.skip_message

        second_highway = make_synthetic_log(
            n_frames=12, seed=13, **CAMERA_SIZE, road_type="highway"
        )
        ingest_and_mine(instance, resources, "repeat", [second_highway])
        (request,) = _tick(instance, lake).run_requests
        assert request.run_key.startswith("retrain-badcases-")


def test_waits_until_every_published_batch_is_mined(low_threshold, tmp_path):
    """Ingested but not yet mined (the automation sensor has not launched mining): no data run
    is in flight, yet a dataset cut now would miss those logs' badcases, so the sensor waits."""
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, tmp_path)
    logs = [make_synthetic_log(n_frames=12, seed=seed, **CAMERA_SIZE) for seed in (21, 22, 23)]
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        partitions = ingest_and_mine(instance, resources, "mined", logs[:2])
        late = ingest_and_mine(instance, resources, "late", logs[2:], groups=("ingest",))
        assert len(unseen_badcases(lake)) >= THRESHOLD  # the first two alone would trigger
        waiting = _tick(instance, lake)
        assert isinstance(waiting, dg.SkipReason)
        assert f"1 published batch(es) not mined yet, e.g. {late[0]}" in waiting.skip_message

        materialize_per_batch(instance, resources, late, ("mining",))
        (request,) = _tick(instance, lake).run_requests
        assert set(partitions) | set(late) <= instance.get_materialized_partitions(
            dg.AssetKey("published_mining")
        )
        assert request.run_key.startswith("retrain-badcases-")
