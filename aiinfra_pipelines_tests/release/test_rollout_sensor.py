"""``rollout_sensor``: certified → shadow → first stage → fresh telemetry, never twice.

Every run request the sensor returns is executed as Dagster would (its asset selection and
run config through ``dg.materialize``), so the test walks the loop the daemon walks.
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from aiinfra_pipelines.release.assets_ota import ota_release
from aiinfra_pipelines.release.assets_rollout import rollout, shadow_report
from aiinfra_pipelines.release.rollout_store import read_state
from aiinfra_pipelines.runs import RELEASE_STEP_TAG
from aiinfra_pipelines.sensors.rollout_sensor import rollout_sensor
from aiinfra_pipelines_tests.support.operations_lake import (
    build_release_world,
    cautious_engine_bytes,
    constant_engine_bytes,
    fleet_vins,
    materialize_telemetry,
    publish_candidate,
    reckless_engine_bytes,
    sha,
    steady_fleet_records,
)

VINS = fleet_vins(8)


def tick(instance, lake, cursor=None):
    return rollout_sensor(
        dg.build_sensor_context(instance=instance, resources={"lake": lake}, cursor=cursor)
    )


def execute(instance, resources, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [shadow_report, rollout, ota_release],
        selection=request.asset_selection,
        instance=instance,
        resources=resources,
        run_config=request.run_config,
        tags=request.tags,
    )


@pytest.fixture
def world(tmp_path):
    world = build_release_world(tmp_path, reckless_engine_bytes())
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        yield {**world, "instance": instance}


def test_the_loop_from_certificate_to_stages_requests_each_step_once(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]

    first = tick(instance, lake)
    (shadow,) = first.run_requests
    assert shadow.run_key == "shadow-2"
    assert shadow.asset_selection == [dg.AssetKey("shadow_report")]
    assert shadow.run_config == {"ops": {"shadow_report": {"config": {"model_version": "2"}}}}
    assert isinstance(tick(instance, lake, first.cursor), dg.SkipReason)  # duplicate tick
    assert [r.run_key for r in tick(instance, lake).run_requests] == ["shadow-2"]  # lost cursor:
    # the same run key again, which Dagster never launches twice

    execute(instance, resources, shadow)
    (start,) = tick(instance, lake, first.cursor).run_requests
    assert start.run_key == "rollout-2-shadow-none"
    # The decision and the OTA repository it implies are one run.
    assert start.asset_selection == [dg.AssetKey("rollout"), dg.AssetKey("ota_release")]
    started = execute(instance, resources, start)
    assert read_state(lake, "2").stage == "canary"
    (ota,) = [
        e for e in started.get_asset_materialization_events() if e.asset_key.path == ["ota_release"]
    ]
    assert ota.materialization.metadata["engines"].value.get("candidate") == "2"
    assert isinstance(tick(instance, lake, first.cursor), dg.SkipReason)  # no telemetry yet

    published = materialize_telemetry(
        instance,
        resources,
        "t1",
        steady_fleet_records(
            sha(reckless_engine_bytes()), sha(cautious_engine_bytes()), VINS[:2], VINS[2:], tag="w0"
        ),
    )
    fresh = tick(instance, lake, first.cursor)
    (judge,) = fresh.run_requests
    assert judge.run_key == f"rollout-2-canary-{published['main_commit']}"
    execute(instance, resources, judge)
    assert read_state(lake, "2").stage == "early"
    again = tick(instance, lake, fresh.cursor)
    assert isinstance(again, dg.SkipReason)
    assert isinstance(tick(instance, lake), dg.SkipReason)  # decided telemetry: nothing to do


def test_a_newer_candidate_shadows_at_once_but_waits_for_the_active_rollout(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    for _ in range(2):  # shadow v2, start its canary
        (request,) = tick(instance, lake).run_requests
        execute(instance, resources, request)
    assert read_state(lake, "2").status == "in_progress"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    client.create_model_version("perception", source="runs:/run-3/model")
    # Its shadow passes, but its gates were judged against production v1, not rollout v2.
    engine = constant_engine_bytes(-5.0, 0.99)
    publish_candidate(lake, "3", engine, resources["release_keys"], reference_version="1")
    (shadow,) = tick(instance, lake).run_requests
    assert shadow.run_key == "shadow-3"
    execute(instance, resources, shadow)
    assert read_state(lake, "3").status == "shadow" and read_state(lake, "3").shadow["passed"]
    assert isinstance(tick(instance, lake), dg.SkipReason)  # v2 is still active
    assert read_state(lake, "2").status == "in_progress"


def test_a_newer_candidate_gated_against_the_active_rollout_takes_the_fleet_over(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    for _ in range(2):  # shadow v2, start its canary
        (request,) = tick(instance, lake).run_requests
        execute(instance, resources, request)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    client.create_model_version("perception", source="runs:/run-3/model")
    v3_engine = constant_engine_bytes(-5.0, 0.99)  # as sure of itself as v2: shadow passes
    publish_candidate(lake, "3", v3_engine, resources["release_keys"], reference_version="2")
    (shadow,) = tick(instance, lake).run_requests
    execute(instance, resources, shadow)
    first = tick(instance, lake)
    (takeover,) = first.run_requests
    assert takeover.run_key == "rollout-3-supersedes-2"
    assert takeover.run_config == {"ops": {"rollout": {"config": {"model_version": "3"}}}}
    done = execute(instance, resources, takeover)
    v2, v3 = read_state(lake, "2"), read_state(lake, "3")
    assert (v2.status, v2.cohort_percent, v2.superseded_by) == ("superseded", 0, "3")
    assert (v3.status, v3.stage, v3.supersedes) == ("in_progress", "canary", "2")
    assert lake.get_json("main", "release/rollout/current.json") == {"model_version": "3"}
    (ota,) = [
        e for e in done.get_asset_materialization_events() if e.asset_key.path == ["ota_release"]
    ]
    assert ota.materialization.metadata["engines"].value.get("candidate") == "3"
    tags = client.get_model_version("perception", "2").tags
    assert tags["rollout_status"] == "superseded" and tags["rollout_superseded_by"] == "3"
    assert isinstance(tick(instance, lake, first.cursor), dg.SkipReason)  # no telemetry yet
    # Fresh telemetry now judges v3's canary, never v2's.
    published = materialize_telemetry(
        instance,
        resources,
        "t3",
        steady_fleet_records(
            sha(v3_engine), sha(cautious_engine_bytes()), VINS[:2], VINS[2:], tag="w0"
        ),
    )
    (judge,) = tick(instance, lake, first.cursor).run_requests
    assert judge.run_key == f"rollout-3-canary-{published['main_commit']}"
    execute(instance, resources, judge)
    assert read_state(lake, "3").stage == "early"
    assert read_state(lake, "2").status == "superseded"


def test_nothing_is_requested_while_a_release_run_is_in_flight(world):
    lake, instance = world["lake"], world["instance"]
    instance.add_run(
        DagsterRun(
            job_name="__ephemeral_asset_job__",
            status=dg.DagsterRunStatus.STARTED,
            tags={RELEASE_STEP_TAG: "rollout"},
        )
    )
    skipped = tick(instance, lake)
    assert isinstance(skipped, dg.SkipReason) and "in flight" in skipped.skip_message


def test_batches_published_between_two_ticks_are_judged_one_at_a_time_in_order(world):
    """Two telemetry batches land before the sensor looks: each gets its own decision, oldest
    first, so a rollout's decisions follow the batches, not how often the daemon ticked."""
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    first = tick(instance, lake)
    execute(instance, resources, first.run_requests[0])  # shadow
    (start,) = tick(instance, lake, first.cursor).run_requests
    execute(instance, resources, start)
    assert read_state(lake, "2").stage == "canary"

    def batch(tag: str) -> list[dict]:
        return steady_fleet_records(
            sha(reckless_engine_bytes()), sha(cautious_engine_bytes()), VINS[:2], VINS[2:], tag=tag
        )

    published = [
        materialize_telemetry(instance, resources, name, batch(name))["main_commit"]
        for name in ("t1", "t2")
    ]
    cursor, judged = first.cursor, []
    for _ in published:
        result = tick(instance, lake, cursor)
        (request,) = result.run_requests
        execute(instance, resources, request)
        cursor = result.cursor
        decision = read_state(lake, "2").history[-1]["decision"]
        judged.append((request.run_key, decision["telemetry_commit"]))

    assert judged == [
        (f"rollout-2-canary-{published[0]}", published[0]),  # t1 alone: canary -> early
        (f"rollout-2-early-{published[1]}", published[1]),  # t2 judged in the early stage
    ]
    assert isinstance(tick(instance, lake, cursor), dg.SkipReason)
