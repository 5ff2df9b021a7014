"""Trigger configs to cars: approval required, signed TUF target, verified, adopted, measured.

A proposal is made by the real proposer from a hand-built scene index, recorded on the lake,
approved (or not) through ``aiinfra triggers approve``, and shipped by the
``trigger_config_release`` asset into the same TUF repository the engines live in. Cars get it
through ``VehicleUpdater.trigger_config`` (tuf.ngclient), drive with it, and the loop summary
measures the targeted slice's yield per trigger config version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.curation.trigger_proposals import propose_trigger_config
from aiinfra_pipelines.demo.settings import DemoSettings
from aiinfra_pipelines.demo.summary import print_trigger_yield, trigger_yield
from aiinfra_pipelines.demo.triggers import adopt_trigger_config, propose_approve_ship
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.fleet.conditions import Conditions
from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import drive_episode
from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, trigger_approval_key, trigger_proposal_key
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.release.assets_ota import ota_release
from aiinfra_pipelines.release.assets_triggers import trigger_config_release, trigger_proposal
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.keys import ReleaseKeys
from aiinfra_pipelines.release.ota import root_metadata, stored_target_key
from aiinfra_pipelines.release.ota_client import OtaVerificationError, VehicleUpdater
from aiinfra_pipelines.release.ota_signing import trigger_target_path
from aiinfra_pipelines.release.trigger_ota import (
    TriggerApprovalError,
    approve_trigger_proposal,
    approved_trigger_config,
    proposed_versions,
    record_proposal,
    ship_trigger_config,
)
from aiinfra_pipelines_tests.support.release_lake import (
    SHIP_TARGET,
    publish_candidate,
    set_production,
    tamper,
)
from aiinfra_pipelines_tests.support.trigger_index import publish_index_and_telemetry, slice_rows

pytestmark = pytest.mark.timeout(180)
runner = CliRunner()
TARGETED = "day/clear/merge"


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory) -> ReleaseKeys:
    return ReleaseKeys(dev_keys_dir=str(tmp_path_factory.mktemp("keys")))


@pytest.fixture
def lake(dagster_home):
    lake = build_lake(load_environment())  # the lake the CLI opens
    lake.ensure_repository()
    return lake


def index() -> pd.DataFrame:
    return pd.concat(
        [slice_rows(TARGETED, 3, 10), slice_rows("night/fog/highway", 5, 10)], ignore_index=True
    )


def propose(lake, metrics: dict[str, float] | None = None) -> str:
    """The real proposer on the hand-built index, recorded on the lake; its version."""
    proposal = propose_trigger_config(
        load_resource_yaml("triggers.yaml"),
        index(),
        metrics or {TARGETED: 0.5},
        driven_hours=1.0,
        existing_versions=proposed_versions(lake),
    )
    assert proposal is not None
    record_proposal(lake, proposal.to_document(), root_run_id=f"propose-{proposal.version}")
    return proposal.version


def approve_by_cli(version: str, by: str = "Jane Operator"):
    return runner.invoke(app, ["triggers", "approve", version, "--by", by])


def ship(instance, lake, keys) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [trigger_config_release],
        instance=instance,
        resources={"lake": lake, "release_keys": keys},
        selection=[trigger_config_release],
    )


def car_updater(lake, model: str, cache: Path) -> VehicleUpdater:
    return VehicleUpdater(
        lake,
        vin=f"TESTVIN-{model}",
        vehicle_model=model,
        engine_target=SHIP_TARGET,
        trusted_root=root_metadata(lake, version=1),
        cache_dir=cache / model,
    )


def test_a_proposal_ships_only_once_approved_and_approvals_are_checked(
    instance, lake, release_keys
) -> None:
    first = propose(lake)
    assert first == "triggers-3"
    result = ship(instance, lake, release_keys)
    metadata = result.asset_materializations_for_node("trigger_config_release")[0].metadata
    assert metadata["shipped"].value is False
    assert ship_trigger_config(lake, release_keys, root_run_id="again") is None

    unknown = approve_by_cli("triggers-9")  # bad input: one line, exit 2 (cli_errors)
    assert unknown.exit_code == 2 and "no trigger proposal 'triggers-9'" in unknown.output
    second = propose(lake, {TARGETED: 0.5, "night/fog/highway": 0.4})
    assert second == "triggers-4"
    superseded = approve_by_cli(first)
    assert superseded.exit_code == 2 and "superseded by triggers-4" in superseded.output
    with pytest.raises(TriggerApprovalError, match="approver's name"):
        approve_trigger_proposal(lake, second, "  ", root_run_id="nobody")
    assert approved_trigger_config(lake) is None

    approved = approve_by_cli(second)
    assert approved.exit_code == 0, approved.output
    record = lake.get_json(MAIN_BRANCH, trigger_approval_key(second))
    assert record["approved_by"] == "Jane Operator"
    stored = lake.get_object(MAIN_BRANCH, trigger_proposal_key(second))
    assert record["proposal_sha256"] == hashlib.sha256(stored).hexdigest()
    listed = runner.invoke(app, ["triggers", "list"], terminal_width=200)
    assert listed.exit_code == 0 and "superseded" in listed.output and "approved" in listed.output

    # Changed after it was approved: what was approved is not what would ship, so nothing does.
    document = json.loads(stored)
    document["config"]["segments"]["max_segment_s"] = 99.0
    tamper(lake, trigger_proposal_key(second), json.dumps(document).encode())
    with pytest.raises(TriggerApprovalError, match="changed after Jane Operator approved"):
        ship_trigger_config(lake, release_keys, root_run_id="tampered")


def test_the_approved_config_is_a_signed_target_beside_the_engines(
    instance, lake, release_keys, tmp_path
) -> None:
    manifest = publish_candidate(lake, "1", seed=1)
    certify_candidate(lake, "1", release_keys.certificate_signer(), root_run_id="certify-1")
    set_production(lake, manifest)
    resources = {"lake": lake, "release_keys": release_keys}
    dg.materialize([ota_release], instance=instance, resources=resources)
    version = propose(lake)
    approve_trigger_proposal(lake, version, "Jane Operator", root_run_id="approve")

    result = ship(instance, lake, release_keys)
    metadata = result.asset_materializations_for_node("trigger_config_release")[0].metadata
    assert metadata["shipped"].value is True
    assert metadata["trigger_config_versions"].value == [version]

    for model in ("sedan-a", "suv-b"):
        car = car_updater(lake, model, tmp_path)
        verified = car.trigger_config()
        assert verified is not None and verified.version == version
        assert verified.custom["approved_by"] == "Jane Operator"
        config = TriggerConfig.load(config=verified.document())
        assert config.version == version and "slice_day_clear_merge" in config.rules
        assert car.update().model_version == "1"  # the engine target is untouched

    # An engine release afterwards signs a new targets version that still lists the config.
    dg.materialize([ota_release], instance=instance, resources=resources)
    fresh = car_updater(lake, "sedan-a", tmp_path / "fresh").trigger_config()
    assert fresh is not None and fresh.version == version


def test_a_tampered_trigger_config_is_rejected(instance, lake, release_keys, tmp_path) -> None:
    version = propose(lake)
    approve_trigger_proposal(lake, version, "Jane Operator", root_run_id="approve")
    publication = ship_trigger_config(lake, release_keys, root_run_id="ship")
    assert publication is not None
    path = trigger_target_path("sedan-a")
    document = approved_trigger_config(lake).config
    shipped = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    key = stored_target_key(path, hashlib.sha256(shipped).hexdigest())
    assert lake.get_object(MAIN_BRANCH, key) == shipped
    document["rules"]["slice_day_clear_merge"]["cooldown_s"] = 0.0  # same length, other rule
    tamper(lake, key, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")

    car = car_updater(lake, "sedan-a", tmp_path)
    with pytest.raises(OtaVerificationError, match="LengthOrHashMismatchError"):
        car.trigger_config()
    assert not any((tmp_path / "sedan-a" / "targets").iterdir()), "nothing may be installed"


def test_a_car_with_the_adopted_config_stamps_it_and_keeps_what_the_old_one_did_not(
    lake, release_keys, tmp_path
) -> None:
    version = propose(lake)
    approve_trigger_proposal(lake, version, "Jane Operator", root_run_id="approve")
    ship_trigger_config(lake, release_keys, root_run_id="ship")
    adopted = adopt_trigger_config(lake, cache_root=tmp_path / "cars")
    assert adopted is not None and adopted.version == version

    # An 8 s merge in clear daylight: the event rules keep 32 of its 41 frames (seed 5).
    short = with_overrides(None, {"simulation": {"road_types": {"merge": {"max_duration_s": 8}}}})
    vehicle = build_fleet(1, config=short)[0]
    conditions = Conditions("merge", "clear", "day", vehicle.city)
    old = drive_episode(vehicle, 0, 5, conditions, short, TriggerConfig.load())
    new = drive_episode(vehicle, 0, 5, conditions, short, adopted)

    assert new and {log.metadata["trigger_config_version"] for log in new} == {version}
    assert all(log.metadata["trigger_config_version"] == "triggers-2" for log in old)
    kept_old = {f.timestamp_ns for log in old for f in log.frames}
    kept_new = {f.timestamp_ns for log in new for f in log.frames}
    assert kept_old <= kept_new and kept_new - kept_old
    assert any(e.rule == "slice_day_clear_merge" for log in new for e in log.events)


def publish_loop_state(lake) -> None:
    """What the loop leaves on main: scene index, 2 h of telemetry, an offline evaluation."""
    telemetry = pd.DataFrame({"batch_id": ["ingest-a"], "frames": [36000]})  # 2 h at 5 Hz
    publish_index_and_telemetry(lake, index(), telemetry)
    evaluation = {
        "candidate": [
            {"slice": "overall", "occupancy_accuracy": 0.9, "frames": 80},
            {"slice": TARGETED, "occupancy_accuracy": 0.55, "frames": 30},
            {"slice": "night/fog/highway", "occupancy_accuracy": 0.95, "frames": 50},
            {"slice": "night/rain/roundabout", "occupancy_accuracy": 0.1, "frames": 3},  # too few
        ]
    }
    key = asset_object_base(dg.AssetKey("offline_eval"), None) + ".json"
    publish_objects(lake, "eval", {key: json.dumps(evaluation).encode()}, "offline_eval", {})


def test_the_proposal_asset_reads_the_loop_from_main_and_approves_only_when_named(
    instance, lake
) -> None:
    publish_loop_state(lake)

    def run(approved_by: str) -> dict:
        result = dg.materialize(
            [trigger_proposal],
            instance=instance,
            resources={"lake": lake},
            run_config={"ops": {"trigger_proposal": {"config": {"approved_by": approved_by}}}},
        )
        materialization = result.asset_materializations_for_node("trigger_proposal")[0]
        return {k: v.value for k, v in materialization.metadata.items()}

    first = run("")
    assert first["trigger_config_version"] == "triggers-3" and first["approved_by"] == ""
    assert f"| slice_day_clear_merge | {TARGETED} |" in first["expected_yield"]
    assert "night/rain/roundabout" not in first["expected_yield"]
    document = lake.get_json(MAIN_BRANCH, trigger_proposal_key("triggers-3"))
    # worst_k 2 of the gated slices, worst first (metric_below is null in triggers.yaml).
    assert [r["slice"] for r in document["rules"]] == [TARGETED, "night/fog/highway"]
    rule = document["rules"][0]
    assert rule["expected_yield"]["driven_hours"] == 2.0
    assert rule["expected_yield"]["frames_per_hour"] == 15.0  # 30 kept frames in 2 h
    assert approved_trigger_config(lake) is None

    second = run("Jane Operator")
    assert second["trigger_config_version"] == "triggers-4"
    assert second["approved_by"] == "Jane Operator"
    assert approved_trigger_config(lake).version == "triggers-4"


def test_the_summary_reports_the_targeted_slice_under_both_versions(lake) -> None:
    version = propose(lake)
    approve_trigger_proposal(lake, version, "Jane Operator", root_run_id="approve")
    both = pd.concat(
        [
            slice_rows(TARGETED, 3, 10, branch="c1"),
            slice_rows("night/fog/highway", 5, 10, branch="c1"),
            slice_rows(TARGETED, 8, 10, version=version, branch="c2"),
            slice_rows("night/fog/highway", 4, 10, version=version, branch="c2"),
        ],
        ignore_index=True,
    )
    telemetry = pd.DataFrame({"batch_id": ["ingest-c1", "ingest-c2"], "frames": [9000, 9000]})
    publish_index_and_telemetry(lake, both, telemetry)

    figures = trigger_yield(lake)
    assert (figures["base_version"], figures["version"]) == ("triggers-2", version)
    rows = {row["trigger_config_version"]: row for row in figures["slices"][TARGETED]}
    assert (rows["triggers-2"]["slice_frames"], rows[version]["slice_frames"]) == (30, 80)
    assert (rows["triggers-2"]["share"], rows[version]["share"]) == (0.375, round(80 / 120, 4))
    assert rows["triggers-2"]["slice_frames_per_hour"] == 60.0  # 9000 frames at 5 Hz: 0.5 h
    assert rows[version]["slice_frames_per_hour"] == 160.0
    json.dumps(figures)  # goes into summary.json as is
    console = Console(record=True, width=160)
    print_trigger_yield(figures, console)
    text = console.export_text()
    assert f"yield of {TARGETED}: triggers-2 → {version}" in text and "160" in text


def test_demo_settings_say_who_approves_on_the_operators_behalf() -> None:
    settings = DemoSettings.load()
    assert settings.approve_trigger_proposals and "operator" in settings.trigger_approver
    config = load_resource_yaml("demo.yaml") | {"trigger_proposals": {"approve": True}}
    with pytest.raises(Exception, match="approver"):
        DemoSettings.load(config)


def test_the_demo_approves_on_the_operators_behalf_only_when_configured(
    lake, release_keys, tmp_path
) -> None:
    publish_loop_state(lake)
    console = Console(record=True, width=200)
    by_hand = dataclasses.replace(DemoSettings.load(), approve_trigger_proposals=False)
    waiting = propose_approve_ship(lake, by_hand, release_keys, cycle=1, console=console)
    assert waiting["proposed"] == "triggers-3" and waiting["approved_by"] is None
    assert waiting["ota_versions"] is None and approved_trigger_config(lake) is None
    assert "aiinfra triggers approve triggers-3 --by NAME" in console.export_text()

    settings = DemoSettings.load()
    shipped = propose_approve_ship(lake, settings, release_keys, cycle=2, console=console)
    assert shipped["proposed"] == "triggers-4"
    assert shipped["approved_by"] == settings.trigger_approver
    assert shipped["ota_versions"]["targets"] == 1
    assert [rule["slice"] for rule in shipped["rules"]] == [TARGETED, "night/fog/highway"]
    json.dumps(shipped)  # goes into summary.json as is
    adopted = adopt_trigger_config(lake, cache_root=tmp_path / "cars")
    assert adopted is not None and adopted.version == "triggers-4"
