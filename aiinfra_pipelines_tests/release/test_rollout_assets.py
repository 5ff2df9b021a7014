"""``rollout`` through ``dg.materialize``: stages on published telemetry, approval, rollbacks.

The worlds hold a certified production engine (v1, cautious) and a certified candidate (v2,
reckless: confident, sees an empty road). Shadow cannot tell that v2 drives into traffic —
neither engine falls back, so it passes — only fleet telemetry can, which is the point of a
canary.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import dagster as dg
import pytest
import yaml
from rich.console import Console

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.lake.layout import CURRENT_ROLLOUT_KEY, MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.operations.telemetry import record_from_episode
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines.release.assets_rollout import rollout, shadow_report
from aiinfra_pipelines.release.cohorts import runs_candidate
from aiinfra_pipelines.release.rollout_store import read_state
from aiinfra_pipelines.status import render_status
from aiinfra_pipelines_tests.support.operations_lake import (
    build_release_world,
    cautious_engine_bytes,
    fleet_vins,
    materialize_telemetry,
    materialized,
    publish,
    reckless_engine_bytes,
    sha,
    steady_fleet_records,
    telemetry_records,
)

VINS = fleet_vins(10)
MAX_ROUNDS = 8  # closed-loop rounds of 6 cars x 2 drives before the slow test gives up
CANDIDATE_SHA = sha(reckless_engine_bytes())
PRODUCTION_SHA = sha(cautious_engine_bytes())


def step(instance, resources, **config) -> dict:
    result = dg.materialize(
        [rollout],
        instance=instance,
        resources=resources,
        run_config={"ops": {"rollout": {"config": config}}},
    )
    return materialized(result, "rollout")


def healthy(tag: str, candidate_vins, rate_factor: float = 1.0) -> list[dict]:
    """Candidate cars at ``rate_factor`` times the control's at-fault rate (VINS[5:])."""
    return steady_fleet_records(
        CANDIDATE_SHA,
        PRODUCTION_SHA,
        candidate_vins,
        VINS[5:],
        tag=tag,
        candidate_rate_factor=rate_factor,
    )


@pytest.fixture
def world(tmp_path):
    world = build_release_world(tmp_path, reckless_engine_bytes())
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        shadow = dg.materialize(
            [shadow_report],
            instance=instance,
            resources=world["resources"],
            run_config={"ops": {"shadow_report": {"config": {"model_version": "2"}}}},
        )
        assert materialized(shadow, "shadow_report")["passed"]
        yield {**world, "instance": instance}


def test_a_good_candidate_widens_stage_by_stage_and_goes_full_only_with_approval(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    registry = world["registry"]

    started = step(instance, resources)
    assert (started["action"], started["status"], started["stage"]) == (
        "start",
        "in_progress",
        "canary",
    )
    assert lake.get_json(MAIN_BRANCH, CURRENT_ROLLOUT_KEY) == {"model_version": "2"}
    assert registry.version("2").tags["rollout_status"] == "in_progress"
    unchanged = step(instance, resources)
    assert unchanged["action"] == "none" and unchanged["main_commit"] == started["main_commit"]

    materialize_telemetry(instance, resources, "t1", healthy("t1", VINS[:2]))
    assert step(instance, resources)["stage"] == "early"
    assert step(instance, resources)["action"] == "none"  # same telemetry, no second advance
    materialize_telemetry(instance, resources, "t2", healthy("t2", VINS[:2]))
    assert step(instance, resources)["stage"] == "wide"
    materialize_telemetry(instance, resources, "t3", healthy("t3", VINS[:4]))
    waiting = step(instance, resources)
    assert (waiting["action"], waiting["status"], waiting["cohort_percent"]) == (
        "await_approval",
        "awaiting_approval",
        50.0,
    )
    assert lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)["version"] == "1"
    assert "candidate" in waiting["cohorts"] and "control" in waiting["cohorts"]

    done = step(instance, resources, approved_by="Grace Hopper")
    assert (done["action"], done["status"], done["cohort_percent"]) == (
        "complete",
        "completed",
        100.0,
    )
    pointer = lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
    assert pointer["version"] == "2" and pointer["engine_sha256"] == CANDIDATE_SHA
    assert pointer["onnx_key"] == world["manifests"]["2"]["ship"]["key"]
    assert load_deployed_engine(lake).engine.sha256 == CANDIDATE_SHA
    assert registry.get_alias("production") == "2" and registry.get_alias("candidate") is None
    assert registry.version("2").tags["rollout_approved_by"] == "Grace Hopper"
    state = read_state(lake, "2")
    assert state.approval.approver == "Grace Hopper"
    assert [e["event"] for e in state.history] == [
        "shadow",
        "stage_started",
        "stage_started",
        "stage_started",
        "awaiting_approval",
        "approved",
        "completed",
    ]

    back = step(instance, resources, rollback_reason="field reports of late braking")
    assert (back["action"], back["status"]) == ("rollback", "rolled_back")
    assert lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY) == world["production_pointer"]
    assert load_deployed_engine(lake).engine.sha256 == PRODUCTION_SHA
    assert registry.get_alias("production") == "1"
    tags = registry.version("2").tags
    assert (
        tags["rollout_status"] == "rolled_back"
        and "late braking" in tags["rollout_rollback_reason"]
    )


def test_approval_before_the_rollout_asks_for_it_fails_clearly(world):
    instance, resources = world["instance"], world["resources"]
    step(instance, resources)
    result = dg.materialize(
        [rollout],
        instance=instance,
        resources=resources,
        raise_on_error=False,
        run_config={"ops": {"rollout": {"config": {"approved_by": "Eve"}}}},
    )
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert "only accepted while awaiting_approval" in error.message
    assert read_state(world["lake"], "2").approval is None


def test_a_bad_candidate_at_canary_is_rolled_back_by_its_telemetry(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    registry = world["registry"]
    step(instance, resources)
    # One collision is no evidence (the stage keeps collecting and says what it needs) ...
    one = telemetry_records(
        CANDIDATE_SHA, VINS[:2], frames=100, collisions=1, cohort="candidate", tag="one"
    ) + telemetry_records(PRODUCTION_SHA, VINS[5:], frames=1000, collisions=3, tag="one")
    materialize_telemetry(instance, resources, "one", one)
    waiting = step(instance, resources)
    assert (waiting["action"], waiting["status"]) == ("wait", "in_progress"), waiting
    assert "keep collecting" in waiting["reason"] and "more candidate frames" in waiting["reason"]
    # ... four times the control's at-fault rate over 40,000 frames is.
    materialize_telemetry(instance, resources, "crash", healthy("crash", VINS[:2], rate_factor=4.0))
    result = dg.materialize([rollout], instance=instance, resources=resources)
    back = materialized(result, "rollout")
    (health,) = result.get_asset_check_evaluations()  # a rollback is red where failures show
    assert health.check_name == "release_not_rolled_back" and not health.passed
    console = Console(record=True, width=240)
    render_status(lake, console)
    shown = console.export_text()
    assert "production: model version 1" in shown and "ROLLED BACK" in shown
    # The same view in the asset's metadata, kept current by every rollout step.
    assert back["production"].startswith("production: model version 1")
    (row,) = [record.data for record in back["release_state"].records]
    assert (row["version"], row["status"], row["decision"]) == ("2", "ROLLED BACK", "rollback")
    assert (back["action"], back["status"], back["cohort_percent"]) == (
        "rollback",
        "rolled_back",
        0.0,
    )
    assert "at_fault_collisions_per_1k_frames" in back["breaches"]
    assert back["exposure_frames"] == 40_200  # both publishes since the canary began
    assert lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY) == world["production_pointer"]
    assert registry.get_alias("production") == "1" and registry.get_alias("candidate") is None
    assert registry.version("2").tags["rollout_status"] == "rolled_back"
    state = read_state(lake, "2")
    assert state.history[-1]["restored_production"] == "1"
    assert not any(runs_candidate(state, vin) for vin in VINS)
    assert step(instance, resources)["action"] == "none"  # stays rolled back


@pytest.mark.slow
def test_a_reckless_candidate_is_rolled_back_from_canary_by_closed_loop_telemetry(
    tmp_path, monkeypatch
):
    """The fleet really drives: cohort cars on v2, the rest on v1, episodes → telemetry."""
    resources_copy = tmp_path / "resources"
    shutil.copytree(resources_dir(), resources_copy)
    gates = yaml.safe_load((resources_copy / "gates.yaml").read_text())
    gates["release"]["rollout"].update(
        stages=[
            {
                "name": "canary",
                "percent": 50,
                "min_candidate_frames": 50,
                "min_candidate_vehicles": 1,
            },
            {"name": "full", "percent": 100},
        ],
        min_control_frames=50,
    )
    (resources_copy / "gates.yaml").write_text(yaml.safe_dump(gates))
    monkeypatch.setenv("AIINFRA_RESOURCES", str(resources_copy))

    world = build_release_world(tmp_path, reckless_engine_bytes())
    lake, resources = world["lake"], world["resources"]
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        dg.materialize([shadow_report], instance=instance, resources=resources)
        assert step(instance, resources)["action"] == "start"
        state = read_state(lake, "2")
        spec = perception_spec()
        engines = {
            "candidate": OnnxRuntimeEngine(reckless_engine_bytes(), spec, name="2"),
            "control": OnnxRuntimeEngine(cautious_engine_bytes(), spec, name="1"),
        }
        fleet = build_fleet(6)
        cohort = {v.vin: "candidate" if runs_candidate(state, v.vin) else "control" for v in fleet}
        assert set(cohort.values()) == {"candidate", "control"}, cohort

        decisions = []
        for round_number in range(MAX_ROUNDS):  # drive until the evidence decides
            records = []

            def report(drive, records=records, round_number=round_number) -> None:
                records.append(
                    record_from_episode(
                        drive.metrics,
                        vin=drive.vehicle.vin,
                        vehicle_model=drive.vehicle.model,
                        software_version=drive.vehicle.software_version,
                        cohort=cohort[drive.vehicle.vin],
                        recorded_at=datetime.now(UTC).isoformat(),
                        record_id=f"{drive.vehicle.vin}-{round_number}-{drive.episode_index}",
                    )
                )

            drive_fleet(
                6,
                2,
                seed=3 + round_number,
                engine_for_vehicle=lambda v: engines[cohort[v.vin]],
                on_episode=report,
            )
            batch = f"closed-loop-{round_number}"
            published = materialize_telemetry(instance, resources, batch, records)
            assert published["accepted"] == 12 and published["quarantined"] == 0
            back = step(instance, resources)
            decisions.append(back["action"])
            if back["action"] != "wait":
                break
    # It kept collecting until harm was shown, then rolled back: never on a first collision.
    assert back["status"] == "rolled_back", (decisions, back)
    assert set(decisions[:-1]) <= {"wait"}, decisions
    assert "at_fault_collisions_per_1k_frames" in back["breaches"]  # it drove into traffic
    assert lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY)["version"] == "1"
    assert world["registry"].get_alias("production") == "1"


def test_a_candidate_whose_certificate_breaks_mid_rollout_is_pulled(world):
    lake, instance, resources = world["lake"], world["instance"], world["resources"]
    step(instance, resources)
    report = world["manifests"]["2"]["reports"]["engine_parity"]["key"]
    publish(lake, {report: b'{"passed": true, "model_version": "2", "edited": 1}'}, "edit")
    back = step(instance, resources)
    assert (back["action"], back["status"]) == ("rollback", "rolled_back")
    assert "certificate no longer verifies" in back["reason"] and "engine_parity" in back["reason"]
    result = dg.materialize(
        [rollout],
        instance=instance,
        resources=resources,
        raise_on_error=False,
        run_config={"ops": {"rollout": {"config": {"approved_by": "Eve"}}}},
    )
    assert not result.success  # and nothing is ever approved on a broken certificate
