"""Shadow mode on real engines: agreement, the recent window, the asset, badcases mined back."""

from __future__ import annotations

import dagster as dg
import mlflow
import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.datasets.selection import configured_training_rows, unseen_badcases
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.mining.engine_runner import run_engine_over_frames
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines.release.assets_rollout import shadow_report
from aiinfra_pipelines.release.certificate import CertificateError
from aiinfra_pipelines.release.rollout_store import read_state
from aiinfra_pipelines.release.shadow import (
    SHADOW_REASON,
    ShadowSettings,
    compare_engines,
    histogram,
    ks_statistic,
    plan_actions,
    psi,
    recent_rows,
    shadow_badcases,
    shadow_badcases_key,
    shadow_badcases_view,
    shadow_report_key,
    shadow_summary,
)
from aiinfra_pipelines_tests.support.operations_lake import (
    cautious_engine_bytes,
    materialized,
    network_engine_bytes,
    publish,
    publish_candidate,
    publish_logs,
    reckless_engine_bytes,
    register_versions,
    release_resources,
    set_production,
    synthetic_logs,
)

SPEC = perception_spec()
SETTINGS = ShadowSettings(
    max_logs=40,
    max_age_days=7,
    max_frames=4000,
    min_frames=50,
    min_occupancy_agreement=0.85,
    max_fallback_rate_increase=0.05,
)


def shadow_config(version: str) -> dict:
    return {"ops": {"shadow_report": {"config": {"model_version": version}}}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Six published logs, production v1 (cautious), certified candidate v2 (reckless)."""
    workdir = tmp_path_factory.mktemp("shadow")
    lake = LocalLake(root=str(workdir / "lake"))
    lake.ensure_repository()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    register_versions(uri, 2)
    resources = release_resources(lake, workdir, uri)
    publish_logs(lake, synthetic_logs(6, frames=20, weather="rain"))
    set_production(
        lake, publish_candidate(lake, "1", cautious_engine_bytes(), resources["release_keys"])
    )
    publish_candidate(lake, "2", reckless_engine_bytes(), resources["release_keys"])
    (workdir / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(workdir / "home")) as instance:
        result = dg.materialize(
            [shadow_report], instance=instance, resources=resources, run_config=shadow_config("2")
        )
        yield {
            "lake": lake,
            "resources": resources,
            "uri": uri,
            "instance": instance,
            "result": result,
            "workdir": workdir,
        }


@pytest.fixture(scope="module")
def frames(world) -> pd.DataFrame:
    lake = world["lake"]
    return load_frames(lake, recent_rows(scene_index_view(lake), 40, 7.0), MAIN_BRANCH)


def engine(data: bytes, name: str) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine(data, SPEC, name=name)


def test_psi_and_ks_measure_distribution_shift():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 4000), rng.normal(0, 1, 4000)
    edges = np.quantile(a, np.linspace(0, 1, 11))
    assert psi(histogram(a, edges), histogram(a, edges)) == pytest.approx(0.0)
    assert psi(histogram(a, edges), histogram(b, edges)) < 0.05
    assert psi(histogram(a, edges), histogram(b + 1.0, edges)) > 0.25
    assert ks_statistic(a, b) < 0.05
    assert ks_statistic(a, b + 1.0) > 0.3
    assert ks_statistic([0.0, 0.1], [0.9, 1.0]) == 1.0
    with pytest.raises(ValueError, match="same bins"):
        psi(np.ones(3), np.ones(4))


def test_recent_window_is_relative_to_the_newest_log():
    index = pd.DataFrame(
        {
            "log_id": ["old", "old", "mid", "new", "new", "new"],
            "timestamp_ns": [1, 2, 1, 1, 2, 3],
            "recorded_at": ["2024-01-01T00:00:00+00:00"] * 2
            + ["2024-03-09T00:00:00+00:00"]
            + ["2024-03-10T00:00:00+00:00"] * 3,
        }
    )
    assert set(recent_rows(index, max_logs=10, max_age_days=7)["log_id"]) == {"mid", "new"}
    assert set(recent_rows(index, max_logs=1, max_age_days=700)["log_id"]) == {"new"}
    assert set(recent_rows(index, 10, 700, max_frames=3)["log_id"]) == {"new"}
    assert set(recent_rows(index, 10, 700, max_frames=2)["log_id"]) == {"new"}  # newest always
    assert recent_rows(index.iloc[:0], 10, 7).empty


def test_planner_replay_is_per_log_and_independent_of_row_order(frames):
    predictions = run_engine_over_frames(engine(network_engine_bytes(3), "n3"), frames, SPEC)
    actions, fallback = plan_actions(frames, predictions)
    order = np.random.default_rng(1).permutation(len(frames))
    shuffled = frames.iloc[order].reset_index(drop=True)
    shuffled_predictions = type(predictions)(
        predictions.occupancy[order], predictions.lead_gap_m[order], predictions.confidence[order]
    )
    actions_2, fallback_2 = plan_actions(shuffled, shuffled_predictions)
    assert np.array_equal(actions[order], actions_2)
    assert np.array_equal(fallback[order], fallback_2)


def test_an_engine_agrees_fully_with_itself(frames):
    net = engine(network_engine_bytes(5), "n5")
    same = run_engine_over_frames(net, frames, SPEC)
    comparison = compare_engines(frames, same, run_engine_over_frames(net, frames, SPEC), SETTINGS)
    summary = shadow_summary(comparison, SETTINGS)
    assert summary["decision_agreement"] == 1.0 and summary["occupancy_agreement"] == 1.0
    assert summary["disagreements"] == 0 and summary["confidence"]["ks"] == 0.0
    assert shadow_badcases(comparison, "5", net.sha256).empty


def test_two_different_networks_disagree_and_the_frames_become_badcases(frames):
    cautious = run_engine_over_frames(engine(cautious_engine_bytes(), "c"), frames, SPEC)
    reckless = run_engine_over_frames(engine(reckless_engine_bytes(), "r"), frames, SPEC)
    comparison = compare_engines(frames, cautious, reckless, SETTINGS)
    summary = shadow_summary(comparison, SETTINGS)
    assert summary["decision_agreement"] < 0.5
    assert summary["occupancy_agreement"] < 0.2  # every cell occupied vs none
    assert summary["passed"]  # neither falls back; agreement is not gated
    badcases = shadow_badcases(comparison, "2", "f" * 64)
    assert len(badcases) == summary["disagreements"] > 0
    assert set(badcases["reasons"]) == {SHADOW_REASON}
    assert set(badcases["candidate_action"]) - {"SLOWER"}  # the reckless engine goes on


def test_a_candidate_that_falls_back_more_does_not_pass_shadow(frames):
    cautious = run_engine_over_frames(engine(cautious_engine_bytes(), "c"), frames, SPEC)
    unsure = run_engine_over_frames(engine(network_engine_bytes(0), "b"), frames, SPEC)
    summary = shadow_summary(compare_engines(frames, cautious, unsure, SETTINGS), SETTINGS)
    assert not summary["passed"]
    assert "falls back on 100.0% of frames" in summary["reasons"][0]
    tiny = compare_engines(
        frames.head(10), cautious_subset(cautious, 10), cautious_subset(cautious, 10), SETTINGS
    )
    assert "only 10 recent frames" in shadow_summary(tiny, SETTINGS)["reasons"][0]


def cautious_subset(predictions, n):
    return type(predictions)(
        predictions.occupancy[:n], predictions.lead_gap_m[:n], predictions.confidence[:n]
    )


def test_shadow_report_publishes_report_state_and_tags(world):
    lake, result = world["lake"], world["result"]
    meta = materialized(result, "shadow_report")
    assert meta["model_version"] == "2" and meta["frames"] == 120 and meta["logs"] == 6
    assert meta["production"] == "1" and meta["passed"] is True
    report = lake.get_json(MAIN_BRANCH, shadow_report_key("2"))
    assert report["summary"]["decision_agreement"] == pytest.approx(meta["decision_agreement"])
    assert report["production_version"] == "1" and len(report["window"]["logs"]) == 6
    state = read_state(lake, "2")
    assert state.status == "shadow" and state.shadow["passed"]
    assert state.previous_production == "1"
    assert state.engine_sha256 == report["engine_sha256"]
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    tags = client.get_model_version("perception", "2").tags
    assert tags["shadow_passed"] == "true"
    assert float(tags["shadow_decision_agreement"]) == pytest.approx(
        meta["decision_agreement"], abs=1e-4
    )


def test_disagreements_reach_the_mined_badcases_and_the_next_training_dataset(world):
    lake = world["lake"]
    badcases = shadow_badcases_view(lake)
    assert len(badcases) == materialized(world["result"], "shadow_report")["badcases"] > 0
    assert lake.object_exists(MAIN_BRANCH, shadow_badcases_key("2"))
    mined = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    assert set(mined["reasons"]) == {SHADOW_REASON}  # the view datasets and sensors read
    rows, _ = configured_training_rows(lake)
    keys = set(zip(badcases["log_id"], badcases["frame_index"], strict=True))
    in_dataset = rows[rows["badcase"]]
    assert keys <= set(zip(in_dataset["log_id"], in_dataset["frame_index"], strict=True))
    assert len(unseen_badcases(lake)) == len(badcases)


def test_a_tampered_engine_stops_shadow_before_anything_is_written(tmp_path):
    lake = LocalLake(root=str(tmp_path / "lake"))
    lake.ensure_repository()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_versions(uri, 1)
    resources = release_resources(lake, tmp_path, uri)
    publish_logs(lake, synthetic_logs(2, frames=8))
    manifest = publish_candidate(lake, "1", cautious_engine_bytes(), resources["release_keys"])
    publish(lake, {manifest["ship"]["key"]: reckless_engine_bytes()}, "swap the engine")
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.materialize(
            [shadow_report],
            instance=instance,
            resources=resources,
            run_config=shadow_config("1"),
            raise_on_error=False,
        )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert failure.cls_name == CertificateError.__name__
    assert "changed after certification" in failure.message
    assert read_state(lake, "1") is None
    assert not lake.object_exists(MAIN_BRANCH, shadow_report_key("1"))


def test_shadow_rerun_refreshes_the_verdict_and_keeps_the_history(world):
    lake = world["lake"]
    before = read_state(lake, "2")
    rerun = dg.materialize(
        [shadow_report],
        instance=world["instance"],
        resources=world["resources"],
        run_config=shadow_config("2"),
    )
    assert materialized(rerun, "shadow_report")["state"] == "shadow verdict refreshed"
    after = read_state(lake, "2")
    assert [e["event"] for e in after.history] == ["shadow", "shadow"]
    assert after.history[0] == before.history[0]
    assert after.cohort_salt == before.cohort_salt and after.status == "shadow"
