"""The model side of the loop through ``dg.materialize``: mine → dataset → train → evaluate.

One real fleet batch is driven, ingested and mined once for the module; the tests then run
training cycles on it. Slow (a few minutes on 2 cores) but run in CI.
"""

from __future__ import annotations

import io
import json
import shutil

import dagster as dg
import mlflow
import pandas as pd
import pytest

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST, TRAINING_LATEST
from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines_tests.support.config_copies import (
    WITHOUT_FIRST_RELEASE_FLOORS,
    resources_with,
)
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
    run_training_cycle,
)

pytestmark = pytest.mark.slow


def _materialized(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        if event.asset_key.path == [asset]:
            return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    return {}


def _evaluation(result: dg.ExecuteInProcessResult, check_name: str) -> dg.AssetCheckEvaluation:
    """The run's one evaluation of ``check_name`` (the dataset's data-health checks run too)."""
    (evaluation,) = [
        check for check in result.get_asset_check_evaluations() if check.check_name == check_name
    ]
    return evaluation


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("loop")
    (workdir / "home").mkdir()
    lake = LocalLake(root=str(workdir / "lake"))
    lake.ensure_repository()
    resources = loop_resources(lake, workdir)
    with (
        resources_with(workdir / "resources-mechanics", WITHOUT_FIRST_RELEASE_FLOORS),
        dg.instance_for_test(temp_dir=str(workdir / "home")) as instance,
    ):
        partitions = ingest_and_mine(instance, resources, "loop", drive_fleet(4, 3, seed=11))
        first = run_training_cycle(instance, resources)
        yield {
            "lake": lake,
            "instance": instance,
            "resources": resources,
            "partitions": partitions,
            "first": first,
            "workdir": workdir,
        }


def test_cycle_tags_the_dataset_commit_that_mlflow_records(loop):
    lake, first = loop["lake"], loop["first"]
    assert first.success
    dataset = _materialized(first, "training_dataset")
    model = _materialized(first, "trained_model")
    assert lake.list_tags()[dataset["dataset_version"]] == dataset["dataset_commit"]
    client = mlflow.MlflowClient(tracking_uri=loop["resources"]["mlflow_tracking"].uri())
    run = client.get_run(model["mlflow_run_id"])
    assert run.data.params["dataset_commit"] == dataset["dataset_commit"]
    assert run.data.params["dataset_version"] == dataset["dataset_version"]
    assert run.data.tags["dagster_run_id"] == first.run_id
    assert model["epochs"] >= 1


def test_splits_never_share_a_log_and_the_benchmark_never_enters_training(loop):
    lake = loop["lake"]
    pointer = lake.get_json(MAIN_BRANCH, TRAINING_LATEST)
    rows = pd.read_parquet(io.BytesIO(lake.get_object(pointer["commit"], pointer["rows_key"])))
    train_logs = set(rows.loc[rows["split"] == "train", "log_id"])
    val_logs = set(rows.loc[rows["split"] == "val", "log_id"])
    assert train_logs and val_logs and not train_logs & val_logs
    benchmark = lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    assert benchmark_log_ids(benchmark) and not benchmark_log_ids(benchmark) & (
        train_logs | val_logs
    )
    manifest = lake.get_json(pointer["commit"], pointer["manifest_key"])
    assert manifest["frames"] == len(rows)
    assert set(manifest["source_commits"]) == set(rows["source_commit"])


def test_offline_eval_reports_every_slice_and_the_model_is_published(loop):
    first = loop["first"]
    evaluation = _materialized(first, "offline_eval")
    assert evaluation["passed"] is True
    # No release yet: judged against nothing (the first-release floors), and it says so.
    assert first.output_for_node("offline_eval")["reference_version"] is None
    comparison = evaluation["comparison"]
    assert "overall" in comparison and "night/\\*/\\*" in comparison  # shown, not emphasis
    # The headline figures are numbers the UI can plot across materializations.
    for metric in ("occupancy_accuracy", "occupancy_f1", "lead_gap_mae_m"):
        assert isinstance(evaluation[f"candidate_{metric}"], float)
    assert _materialized(first, "published_model")["main_commit"]
    check = _evaluation(first, "offline_eval_no_slice_regression")
    assert check.passed


def test_remining_with_the_same_engine_does_no_inference(loop):
    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("auto_labels", "mined_badcases", "published_mining"),
        instance=loop["instance"],
        resources=loop["resources"],
        partition_key=loop["partitions"][0],
    )
    assert _materialized(result, "mined_badcases")["inference"].startswith("skipped")


def test_candidate_trained_without_night_is_refused_by_the_night_slice(loop, monkeypatch):
    lake, first = loop["lake"], loop["first"]
    pointer = {
        "version": "model-1",
        "model_uri": first.output_for_node("trained_model")["model_uri"],
    }
    publish_objects(
        lake,
        "test-release",
        {PRODUCTION_POINTER_KEY: json.dumps(pointer).encode()},
        "release model-1 (test stand-in for the release layer)",
        {"kind": "release"},
    )
    changed = loop["workdir"] / "resources"
    shutil.copytree(resources_dir(), changed, dirs_exist_ok=True)
    datasets_yaml = changed / "datasets.yaml"
    datasets_yaml.write_text(
        datasets_yaml.read_text().replace("exclude: {}", "exclude: {lighting: [night]}")
    )
    monkeypatch.setenv("AIINFRA_RESOURCES", str(changed))
    main_before = lake.resolve_ref(MAIN_BRANCH)

    second = run_training_cycle(loop["instance"], loop["resources"], raise_on_error=False)

    check = _evaluation(second, "offline_eval_no_slice_regression")
    assert not check.passed
    failures = check.metadata["failures"].value
    assert any(failure.startswith("night/") for failure in failures), failures
    assert second.output_for_node("offline_eval")["reference_version"] == "model-1"
    assert _materialized(second, "published_model") == {}
    # The regressed candidate's record never reaches main (its dataset version does).
    published = [
        c for c in lake.log(MAIN_BRANCH, limit=50) if c.metadata.get("kind") == "evaluation"
    ]
    assert all(c.id in {x.id for x in lake.log(main_before)} for c in published)


def test_changing_the_benchmark_is_an_explicit_recorded_act(loop):
    lake = loop["lake"]
    before = lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    member = sorted(benchmark_log_ids(before))[0]

    def change(reason: str) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            all_assets_and_checks(),
            selection=dg.AssetSelection.assets("benchmark_set"),
            instance=loop["instance"],
            resources=loop["resources"],
            run_config={
                "ops": {"benchmark_set": {"config": {"remove_logs": [member], "reason": reason}}}
            },
            raise_on_error=False,
        )

    refused = change("")
    assert not refused.success
    assert lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST) == before

    accepted = change("log re-labelled after review")
    assert accepted.success
    after = lake.get_json(MAIN_BRANCH, BENCHMARK_MANIFEST)
    assert member not in benchmark_log_ids(after) and after["version"] != before["version"]
    assert after["changes"][-1]["kind"] == "explicit"
    assert after["changes"][-1]["reason"] == "log re-labelled after review"
