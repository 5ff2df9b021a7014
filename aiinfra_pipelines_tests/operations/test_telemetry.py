"""Fleet telemetry: records, validation and quarantine, landing, discovery, publishing."""

from __future__ import annotations

import io
import json

import dagster as dg
import pandas as pd
import pytest

from aiinfra_pipelines.fleet.episode_metrics import EpisodeMetrics, collision_record
from aiinfra_pipelines.fleet.sim_env import EgoFootprint
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.logs.model import OtherVehicle
from aiinfra_pipelines.operations.assets import (
    fleet_telemetry,
    telemetry_batches,
    telemetry_quarantine_key,
    telemetry_records_key,
)
from aiinfra_pipelines.operations.landing import discover_telemetry, land_telemetry
from aiinfra_pipelines.operations.telemetry import TelemetrySettings, record_from_episode
from aiinfra_pipelines.operations.telemetry_checks import check_record
from aiinfra_pipelines.operations.telemetry_intake import (
    parse_upload,
    telemetry_summary,
    validate_uploads,
)
from aiinfra_pipelines.release.rollout_telemetry import (
    latest_telemetry_commit,
    telemetry_publishes,
    telemetry_since,
)
from aiinfra_pipelines.release.shadow import shadow_agreement
from aiinfra_pipelines.sensors.rollout_sensor import telemetry_sensor
from aiinfra_pipelines_tests.support.operations_lake import (
    ANON_KEY,
    ANON_KEY_HEX,
    fleet_vins,
    materialized,
    telemetry_records,
)

SETTINGS = TelemetrySettings.load()
SHA = "a" * 64
VINS = fleet_vins(4)


def good(**changes) -> dict:
    return {**telemetry_records(SHA, VINS[:1], frames=50, fallback_share=0.2)[0], **changes}


def validate(records, name="telemetry/uploads/b/records.json"):
    return validate_uploads(
        [(name, json.dumps(records).encode())],
        batch_id="ingest-b",
        source_commit="c" * 64,
        key=ANON_KEY,
    )


def test_an_episode_becomes_a_record_with_its_vehicle_side_aggregates():
    metrics = EpisodeMetrics(
        perception_source="engine",
        engine_name="2",
        engine_sha256=SHA,
        steps=5,
        duration_s=1.0,
        collision=False,
        collision_step=None,
        min_ttc_s=0.6,
        min_lead_gap_m=8.0,
        progress_m=20.0,
        mean_speed_mps=20.0,
        hard_brakes=2,
        max_abs_jerk_mps3=1.0,
        rms_jerk_mps3=0.5,
        fallback_steps=2,
        fallback_activations=1,
        decisions={"IDLE": 5},
        confidence=[0.1, 0.2, 0.95, 0.95, 1.0],
        mean_confidence=0.64,
        min_confidence=0.1,
        events=[],
        perception_ms=[2.0, 3.0, 4.0, 5.0, 100.0],
    )
    record = record_from_episode(
        metrics,
        vin=VINS[0],
        vehicle_model="sedan-a",
        software_version="2",
        cohort="candidate",
        recorded_at="2024-06-03T06:00:00+00:00",
        record_id="r1",
    )
    assert record["frames"] == 5 and record["engine_sha256"] == SHA
    assert record["confidence_histogram"] == [0, 1, 1, 0, 0, 0, 0, 0, 0, 3]
    assert (record["fallback_frames"], record["fallback_events"]) == (2, 1)
    assert (record["near_misses"], record["collisions"], record["hard_brakes"]) == (1, 0, 2)
    assert record["latency_ms_p50"] == 4.0 and record["latency_ms_p99"] > 90.0
    assert check_record(record, SETTINGS) == []
    crashed = record_from_episode(
        {**metrics.to_dict(), "collision": True},
        vin=VINS[0],
        vehicle_model="sedan-a",
        software_version="2",
        cohort="candidate",
        recorded_at="2024-06-03T06:00:00+00:00",
        record_id="r2",
    )
    assert (crashed["collisions"], crashed["near_misses"]) == (1, 0)
    assert crashed["at_fault_collisions"] == 1  # nothing recorded about it: not exonerated
    rear_ended = record_from_episode(
        {
            **metrics.to_dict(),
            "collision": True,
            "collision_detail": collision_record(
                step=3,
                ego_speed_mps=0.0,  # stopped, hit from behind
                ego_accel_mps2=0.0,
                footprint=EgoFootprint(length_m=5.0, width_m=2.0, straddles_lanes=False),
                partner=OtherVehicle(vehicle_id=9, x=-5.1, y=0.0, vx=8.0, vy=0.0, lane_offset=0),
            ),
        },
        vin=VINS[0],
        vehicle_model="sedan-a",
        software_version="2",
        cohort="candidate",
        recorded_at="2024-06-03T06:00:00+00:00",
        record_id="r3",
    )
    # A collision, but not a safety event against the engine: the simulation's rule, on the car.
    assert (rear_ended["collisions"], rear_ended["at_fault_collisions"]) == (1, 0)
    assert check_record(rear_ended, SETTINGS) == []
    assert check_record({**rear_ended, "at_fault_collisions": 2}, SETTINGS)[0][0] == (
        "inconsistent_counts"
    )


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"vin": "NOT-A-VIN"}, "invalid_vin"),
        ({"engine_sha256": "xyz"}, "invalid_engine_sha256"),
        ({"cohort": "beta"}, "invalid_cohort"),
        ({"recorded_at": "yesterday"}, "invalid_recorded_at"),
        ({"recorded_at": "2024-06-03T06:00:00"}, "invalid_recorded_at"),
        ({"frames": 0}, "invalid_frames"),
        ({"frames": 50.5}, "invalid_frames"),
        ({"collisions": -1}, "invalid_count"),
        ({"fallback_frames": 60}, "inconsistent_counts"),
        ({"fallback_events": 11}, "inconsistent_counts"),
        ({"latency_ms_p95": 1.0}, "invalid_latency"),
        ({"latency_ms_p99": float("nan")}, "invalid_latency"),
        ({"latency_ms_p99": 1e9}, "invalid_latency"),
        ({"confidence_histogram": [50]}, "invalid_histogram"),
        ({"confidence_histogram": [49] + [0] * 9}, "invalid_histogram"),
        ({"software_version": ""}, "invalid_field"),
        ({"collisions": True}, "invalid_count"),
        ({"shadow_engine_sha256": "xyz"}, "invalid_engine_sha256"),
        (
            {"shadow_engine_sha256": SHA, "shadow_frames": 5, "shadow_agreements": 6},
            "invalid_count",
        ),
        ({"shadow_frames": 5, "shadow_agreements": 0}, "inconsistent_counts"),
    ],
)
def test_each_bad_record_is_quarantined_with_its_reason(changes, code):
    batch = validate([good(record_id="ok"), good(record_id="bad", **changes)])
    assert len(batch.accepted) == 1 and len(batch.quarantined) == 1
    row = batch.quarantined.iloc[0]
    assert code in row["reason_codes"].split(",")
    assert row["record_index"] == 1
    assert json.loads(row["reasons"])[0]["message"]


def test_missing_fields_duplicates_and_unreadable_files_are_quarantined_not_lost():
    incomplete = {k: v for k, v in good(record_id="x").items() if k != "frames"}
    batch = validate_uploads(
        [
            (
                "telemetry/uploads/b/a.json",
                json.dumps([good(record_id="r1"), incomplete, good(record_id="r1"), 7]).encode(),
            ),
            ("telemetry/uploads/b/broken.json", b"{not json"),
            ("telemetry/uploads/b/notes.txt", b"hello"),
        ],
        batch_id="ingest-b",
        source_commit="c" * 64,
        key=ANON_KEY,
    )
    assert len(batch.accepted) == 1
    assert batch.reason_counts == {
        "duplicate_record_id": 1,
        "missing_field": 1,
        "not_a_record": 1,
        "unreadable_upload": 2,
    }
    unreadable = batch.quarantined[batch.quarantined["record_index"] == -1]
    assert set(unreadable["source_key"]) == {
        "telemetry/uploads/b/broken.json",
        "telemetry/uploads/b/notes.txt",
    }


def test_published_rows_carry_no_vin_and_no_raw_record_id():
    records = telemetry_records(SHA, VINS, frames=20)
    batch = validate([*records, good(record_id=f"{VINS[0]}-bad", frames=-1)])
    text = batch.accepted.to_json() + batch.quarantined.to_json()
    for vin in VINS:
        assert vin not in text
    assert batch.accepted["record_id"].str.startswith("tel-").all()
    assert batch.accepted["vehicle_pseudonym"].str.startswith("veh-").all()
    assert (
        batch.quarantined["vehicle_pseudonym"].iloc[0]
        == batch.accepted["vehicle_pseudonym"].iloc[0]
    )
    summary = telemetry_summary(batch.accepted)
    assert set(summary["vehicle_model"]) == {"sedan-a", "suv-b"}
    assert summary["frames"].sum() == 80


def test_parquet_and_json_lines_uploads_parse_like_json():
    records = telemetry_records(SHA, VINS[:2], frames=10)
    buffer = pd.DataFrame(records)
    data = io.BytesIO()
    buffer.to_parquet(data, index=False)
    assert parse_upload("x.parquet", data.getvalue()) == records
    lines = "\n".join(json.dumps(r) for r in records).encode()
    assert parse_upload("x.jsonl", lines) == records
    assert parse_upload("x.json", json.dumps({"records": records}).encode()) == records


@pytest.fixture
def resources(local_lake):
    from aiinfra_pipelines.ingest.resources import AnonymizationKey
    from aiinfra_pipelines.lake.io_manager import LakeIOManager

    return {
        "lake": local_lake,
        "io_manager": LakeIOManager(lake=local_lake),
        "anonymization": AnonymizationKey(key_hex=ANON_KEY_HEX),
    }


def publish_batch(instance, resources, branch, raise_on_error=True):
    instance.add_dynamic_partitions(telemetry_batches.name, [branch])
    return dg.materialize(
        [fleet_telemetry],
        instance=instance,
        resources=resources,
        partition_key=branch,
        raise_on_error=raise_on_error,
    )


def test_landed_batches_are_discovered_validated_and_published(instance, resources, local_lake):
    lake = local_lake
    bad = good(record_id="bad", cohort="beta")
    landed = land_telemetry(lake, "day1", [*telemetry_records(SHA, VINS, frames=30), bad])
    land_telemetry(
        lake,
        "day1",
        telemetry_records(SHA, VINS[:2], frames=30, tag="pq"),
        fmt="parquet",
        file_name="more.parquet",
    )
    batches, cursor = discover_telemetry(lake, {})
    assert [b.partition_key for b in batches] == ["ingest-day1"]
    assert discover_telemetry(lake, cursor)[0] == []
    result = publish_batch(instance, resources, landed.branch)
    meta = materialized(result, "fleet_telemetry")
    assert (meta["accepted"], meta["quarantined"]) == (6, 1)
    assert meta["reasons"] == {"invalid_cohort": 1}
    published = pd.read_parquet(
        io.BytesIO(lake.get_object(MAIN_BRANCH, telemetry_records_key("ingest-day1")))
    )
    assert len(published) == 6 and "vin" not in published.columns
    assert lake.object_exists(MAIN_BRANCH, telemetry_quarantine_key("ingest-day1"))
    assert not lake.list_objects(MAIN_BRANCH, prefix=SETTINGS.upload_prefix)  # raw stays out
    publishes = telemetry_publishes(lake)
    assert len(publishes) == 1 and publishes[0].commit == meta["main_commit"]
    assert latest_telemetry_commit(lake) == meta["main_commit"]
    assert len(telemetry_since(lake, None)) == 6
    assert telemetry_since(lake, meta["main_commit"]).empty


def test_a_republished_batch_counts_only_its_new_records(instance, resources, local_lake):
    lake = local_lake
    land_telemetry(lake, "day2", telemetry_records(SHA, VINS[:2], frames=30))
    first = materialized(publish_batch(instance, resources, "ingest-day2"), "fleet_telemetry")
    land_telemetry(
        lake, "day2", telemetry_records(SHA, VINS[2:], frames=30, tag="late"), file_name="late.json"
    )
    second = materialized(publish_batch(instance, resources, "ingest-day2"), "fleet_telemetry")
    assert second["accepted"] == 4
    since_first = telemetry_since(lake, first["main_commit"])
    assert len(since_first) == 2
    assert len(telemetry_since(lake, None)) == 4


def test_a_batch_with_nothing_valid_publishes_its_quarantine_and_fails(
    instance, resources, local_lake
):
    lake = local_lake
    land_telemetry(lake, "bad", [], raw_files={"garbage.json": b"[1, 2"})
    result = publish_batch(instance, resources, "ingest-bad", raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data
    assert "every telemetry record of ingest-bad was quarantined" in failure.error.message
    assert lake.object_exists(MAIN_BRANCH, telemetry_quarantine_key("ingest-bad"))
    lake.create_branch("ingest-none")
    empty = publish_batch(instance, resources, "ingest-none", raise_on_error=False)
    assert (
        "no telemetry uploads" in empty.get_step_failure_events()[0].step_failure_data.error.message
    )


def test_the_telemetry_sensor_requests_each_landed_head_once(instance, local_lake):
    lake = local_lake
    land_telemetry(lake, "s1", telemetry_records(SHA, VINS[:1], frames=10))
    context = dg.build_sensor_context(instance=instance, resources={"lake": lake})
    first = telemetry_sensor(context)
    assert [r.partition_key for r in first.run_requests] == ["ingest-s1"]
    assert first.dynamic_partitions_requests[0].partition_keys == ["ingest-s1"]
    again = telemetry_sensor(
        dg.build_sensor_context(instance=instance, resources={"lake": lake}, cursor=first.cursor)
    )
    assert again.run_requests == []
    later = land_telemetry(
        lake, "s1", telemetry_records(SHA, VINS[1:2], frames=10, tag="b"), file_name="b.json"
    )
    third = telemetry_sensor(
        dg.build_sensor_context(instance=instance, resources={"lake": lake}, cursor=first.cursor)
    )
    assert [r.run_key for r in third.run_requests] == [f"telemetry-ingest-s1@{later.commit}"]
    assert third.run_requests[0].tags["aiinfra/source_commit"] == later.commit
    lake.create_branch("ingest-logs-only")  # a log batch without telemetry is not a request
    assert (
        telemetry_sensor(
            dg.build_sensor_context(
                instance=instance, resources={"lake": lake}, cursor=third.cursor
            )
        ).run_requests
        == []
    )


def test_shadow_mode_counts_are_published_and_summarized_per_shadow_engine():
    shadowed = [
        good(record_id=f"s{i}", shadow_engine_sha256=SHA, shadow_frames=50, shadow_agreements=a)
        for i, a in enumerate((40, 45))
    ]
    batch = validate([*shadowed, good(record_id="plain")])
    assert batch.quarantined.empty
    plain = batch.accepted[batch.accepted["shadow_engine_sha256"] == ""]
    assert len(plain) == 1 and int(plain["shadow_frames"].iloc[0]) == 0
    assert shadow_agreement(batch.accepted) == {
        SHA: {"vehicles": 1, "frames": 100, "decision_agreement": 0.85}
    }
    assert shadow_agreement(batch.accepted.drop(columns=["shadow_engine_sha256"])) == {}
