"""Low-value segments travel as index records; the platform pulls the raw logs it wants."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from aiinfra_pipelines.fleet.landing import LandedBatch
from aiinfra_pipelines.ingest.pulls import (
    CLOSED,
    EXPIRED,
    OPEN,
    SERVED,
    answered,
    max_open_days,
    open_pull_requests,
    pull_requests,
    request_raw_segments,
)
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.logs.model import DriveLog, TriggerEvent
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.vehicle.fleet_upload import upload_through_outboxes
from aiinfra_pipelines.vehicle.index_only import IndexOnlySettings, index_record, is_low_value
from aiinfra_pipelines.vehicle.outbox_settings import OutboxSettings
from aiinfra_pipelines_tests.support.ingest_runs import (
    materialize_partition,
    partition_of,
    verdicts_of,
)

pytestmark = pytest.mark.timeout(300)


def quiet_night_sample(seed: int) -> DriveLog:
    """A night condition sample on a quiet road: the kind of segment a car keeps index-only."""
    log = make_synthetic_log(n_frames=20, seed=seed, lighting="night", plates_per_frame=1)
    middle = log.frames[10]
    return dataclasses.replace(log, events=[TriggerEvent(middle.timestamp_ns, "night", 1.0, 1.0)])


def encoded(log: DriveLog) -> tuple[str, bytes, DriveLog]:
    return log.log_id, encode_drive_log(log), log


def ingest(instance, resources, batch) -> dict[str, str]:
    result = materialize_partition(instance, resources, partition_of(batch))
    assert result.success
    return verdicts_of(result)


def test_the_index_only_rules_pick_quiet_condition_samples_only():
    settings = IndexOnlySettings.load()
    assert is_low_value(quiet_night_sample(1), settings)
    assert not is_low_value(make_synthetic_log(seed=1), settings)  # a hard brake: an event
    busy = make_synthetic_log(n_frames=20, seed=1, lighting="night", plates_per_frame=6)
    busy = dataclasses.replace(busy, events=quiet_night_sample(1).events)
    assert not is_low_value(busy, settings)  # six cars around: not a quiet road


def test_an_index_only_segment_is_indexed_then_pulled_and_ingested(
    local_lake, instance, ingest_resources, tmp_path
):
    sample = quiet_night_sample(3)
    first = upload_through_outboxes(local_lake, [encoded(sample)], "io-1", root=tmp_path / "cars")
    assert (first.index_only, first.raw_logs) == (1, 0)
    assert first.batch is not None
    assert first.batch.keys == [f"logs/{sample.log_id}.index.json"]
    record = json.loads(local_lake.get_object(first.batch.commit, first.batch.keys[0]))
    assert record["thumbnail"]["encoding"] == "jpeg" and record["raw_bytes"] > 0
    (car,) = first.cars.values()
    assert car["held"]["logs"] == 1

    assert ingest(instance, ingest_resources, first.batch) == {first.batch.keys[0]: "accepted"}
    assert scene_index_view(local_lake).empty  # nothing to train on yet
    index = scene_index_view(local_lake, include_index_only=True)
    assert len(index) == 20 and not index["raw_available"].any()
    assert set(index["frames_object"]) == {""} and set(index["slice"]) == {"night/clear/highway"}
    assert index["vehicle_pseudonym"].str.startswith("veh-").all()
    assert sample.metadata["vin"] not in index.to_csv()

    pulled = request_raw_segments(
        local_lake, index, [sample.log_id, "unknown-log"], reason="more night", requested_by="t"
    )
    assert pulled.requested == [sample.log_id] and "unknown-log" in pulled.skipped
    assert [r["status"] for r in pull_requests(local_lake)] == [OPEN]

    second = upload_through_outboxes(local_lake, [], "io-2", root=tmp_path / "cars")
    assert second.pulls_served == 1 and second.batch is not None
    assert second.batch.keys == [f"logs/{sample.log_id}.mcap"]
    assert ingest(instance, ingest_resources, second.batch) == {second.batch.keys[0]: "accepted"}
    (request,) = pull_requests(local_lake)
    assert request["status"] == SERVED
    assert request["served_by"]["log_key"] == second.batch.keys[0]
    # The bytes that arrived are the ones the car indexed.
    assert request["raw_sha256"] == request["served_by"]["sha256"] == record["raw_sha256"]
    raw = scene_index_view(local_lake)
    assert len(raw) == 20 and raw["raw_available"].all() and set(raw["log_id"]) == {sample.log_id}
    both = scene_index_view(local_lake, include_index_only=True)
    assert both["raw_available"].all()  # the index rows gave way to the raw ones

    # A second request for the same segment is refused: it is served.
    again = request_raw_segments(
        local_lake, both, [sample.log_id], reason="again", requested_by="t"
    )
    assert again.requested == [] and sample.log_id in again.skipped


def test_a_pull_for_an_evicted_segment_is_closed_with_the_reason(
    local_lake, instance, ingest_resources, tmp_path
):
    sample = quiet_night_sample(5)
    size = len(encoded(sample)[1])
    tight = dataclasses.replace(OutboxSettings.load(), cache_cap_bytes=int(size * 1.5))
    first = upload_through_outboxes(
        local_lake, [encoded(sample)], "ev-1", root=tmp_path / "cars", outbox_settings=tight
    )
    ingest(instance, ingest_resources, first.batch)
    index = scene_index_view(local_lake, include_index_only=True)
    request_raw_segments(local_lake, index, [sample.log_id], reason="fog", requested_by="t")

    # The same car drives on: a new log overflows its cache and the held one is evicted first.
    newer = make_synthetic_log(n_frames=20, seed=6, vin=sample.metadata["vin"])
    second = upload_through_outboxes(
        local_lake, [encoded(newer)], "ev-2", root=tmp_path / "cars", outbox_settings=tight
    )
    assert second.pulls_unservable == 1 and second.pulls_served == 0
    assert second.evictions == 1  # this upload's own, not the car's lifetime count
    assert set(second.bytes_sent_by_class) == {"normal"}  # the new log and the notice
    (car,) = second.cars.values()
    assert [e["log_id"] for e in car["evictions"]] == [sample.log_id]
    assert car["evictions"][0]["held"] is True
    assert f"logs/{sample.log_id}.unservable.json" in second.batch.keys
    verdicts = ingest(instance, ingest_resources, second.batch)
    assert verdicts[f"logs/{sample.log_id}.unservable.json"] == "notice"
    (request,) = pull_requests(local_lake)
    assert request["status"] == CLOSED
    assert request["closed_reason"].startswith("evicted from the vehicle's cache at ")
    # Nothing half-done: the notice closed the request and no raw rows appeared for it.
    assert sample.log_id not in set(scene_index_view(local_lake)["log_id"])
    # Answered once: the next upload neither repeats the notice nor counts it again.
    third = upload_through_outboxes(
        local_lake, [], "ev-3", root=tmp_path / "cars", outbox_settings=tight
    )
    assert third.pulls_unservable == 0 and third.batch is None
    assert third.evictions == 0 and sum(third.bytes_sent_by_class.values()) == 0


def test_a_pulled_log_that_is_quarantined_closes_its_request(
    local_lake, instance, ingest_resources, tmp_path
):
    """The car sent it and holds it no more: the request must not wait forever."""
    raw = make_synthetic_log(
        n_frames=20, seed=11, lighting="night", plates_per_frame=1, vehicle_anonymized=False
    )
    unblurred = dataclasses.replace(raw, events=quiet_night_sample(11).events)
    first = upload_through_outboxes(local_lake, [encoded(unblurred)], "q-1", root=tmp_path / "c")
    ingest(instance, ingest_resources, first.batch)
    index = scene_index_view(local_lake, include_index_only=True)
    request_raw_segments(local_lake, index, [unblurred.log_id], reason="x", requested_by="t")
    second = upload_through_outboxes(local_lake, [], "q-2", root=tmp_path / "c")
    assert ingest(instance, ingest_resources, second.batch) == {
        f"logs/{unblurred.log_id}.mcap": "quarantined"
    }
    (request,) = pull_requests(local_lake)
    assert request["status"] == CLOSED
    assert request["closed_reason"] == "the raw log arrived and was quarantined: residual_pii"


def test_a_malformed_index_record_is_quarantined_and_its_batch_goes_on(
    local_lake, instance, ingest_resources
):
    good = make_synthetic_log(n_frames=20, seed=12)
    uploads = {
        "logs/empty.index.json": b'{"kind": "aiinfra.index_record", "metadata": {}, "frames": []}',
        "logs/junk.index.json": b"\x00not json",
        "logs/numbers.index.json": json.dumps(_record_with_text_speed()).encode(),
        f"logs/{good.log_id}.mcap": encode_drive_log(good),
    }
    local_lake.create_branch("ingest-bad-index", source_ref="main")
    for key, data in uploads.items():
        local_lake.put_object("ingest-bad-index", key, data)
    commit = local_lake.commit("ingest-bad-index", "upload", {"kind": "ingest-upload"})
    batch = LandedBatch("ingest-bad-index", commit, sorted(uploads), 0)
    verdicts = ingest(instance, ingest_resources, batch)
    assert verdicts[f"logs/{good.log_id}.mcap"] == "accepted"
    bad = {key: v for key, v in verdicts.items() if key.endswith(".index.json")}
    assert set(bad.values()) == {"quarantined"} and len(bad) == 3
    quarantine = quarantine_view(local_lake)
    assert set(quarantine["reason_codes"]) == {"bad_index_record"}


def _record_with_text_speed() -> dict:
    sample = quiet_night_sample(13)
    record = json.loads(index_record(sample, b"raw", IndexOnlySettings.load()))
    record["frames"][3]["speed_mps"] = "fast"
    return record


def test_an_unanswered_request_expires_and_may_be_asked_again(local_lake, tmp_path):
    sample = quiet_night_sample(14)
    upload_through_outboxes(local_lake, [encoded(sample)], "x-1", root=tmp_path / "c")
    index = _index_rows_of(sample)
    request_raw_segments(local_lake, index, [sample.log_id], reason="x", requested_by="t")
    later = datetime.now(UTC) + timedelta(days=max_open_days() + 1)
    (request,) = pull_requests(local_lake, now=later)
    assert request["status"] == EXPIRED
    assert open_pull_requests(local_lake, now=later) == {}
    assert open_pull_requests(local_lake)[sample.log_id]["status"] == OPEN


def _index_rows_of(log: DriveLog):
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "log_id": log.log_id,
                "raw_available": False,
                "slice": "night/clear/highway",
                "vehicle_pseudonym": "veh-0000000000000000",
                "log_key": f"logs/{log.log_id}.index.json",
            }
        ]
    )


def test_other_bytes_than_the_car_indexed_close_the_request(local_lake, tmp_path):
    """A raw log must be the recording its index described: anything else is not an answer."""
    sample = quiet_night_sample(15)
    upload_through_outboxes(local_lake, [encoded(sample)], "sha-1", root=tmp_path / "c")
    index = _index_rows_of(sample)
    request_raw_segments(local_lake, index, [sample.log_id], reason="x", requested_by="t")
    (request,) = pull_requests(local_lake)
    assert request["raw_sha256"] == ""  # these rows name no index record: nothing to hold to
    held = {**request, "raw_sha256": "a" * 64}
    local_lake.put_object("main", f"pulls/{sample.log_id}.json", json.dumps(held).encode())
    local_lake.commit("main", "an index that names its raw log", {})
    updates = answered(
        local_lake,
        "main",
        served={sample.log_id: {"partition": "p", "log_key": "k", "sha256": "b" * 64}},
        unservable={},
    )
    closed = json.loads(updates[f"pulls/{sample.log_id}.json"])
    assert closed["status"] == CLOSED
    assert closed["closed_reason"].startswith("the car sent other bytes than it indexed")
