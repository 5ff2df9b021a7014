"""The car's outbox in fleet telemetry: backlog, bytes per priority, evictions, served pulls."""

from __future__ import annotations

import dataclasses
import io
import json

import dagster as dg
import pandas as pd
import pytest

from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.operations.assets import (
    fleet_telemetry,
    telemetry_batches,
    telemetry_records_key,
)
from aiinfra_pipelines.operations.landing import land_telemetry
from aiinfra_pipelines.operations.outbox_telemetry import OUTBOX_DEFAULTS, outbox_fields
from aiinfra_pipelines.operations.telemetry import TelemetrySettings
from aiinfra_pipelines.operations.telemetry_checks import check_record
from aiinfra_pipelines.vehicle.outbox import Outbox
from aiinfra_pipelines.vehicle.outbox_settings import OutboxSettings
from aiinfra_pipelines_tests.support.operations_lake import ANON_KEY_HEX, fleet_vins
from aiinfra_pipelines_tests.support.operations_lake import telemetry_records as records_for

SHA = "c" * 64
SETTINGS = TelemetrySettings.load()


@pytest.fixture
def car_outbox(tmp_path, local_lake) -> dict:
    """A car that sent one urgent log, holds one, had one evicted and still queues one."""
    settings = dataclasses.replace(OutboxSettings.load(), cache_cap_bytes=2500)
    outbox = Outbox(tmp_path / "car", settings)
    outbox.enqueue("urgent-1", b"u" * 1000, ["near_collision"])
    outbox.hold("quiet-1", b"q" * 1000, ["night"], b'{"index": true}')
    outbox.drain(local_lake, "ingest-car", window_open=False)
    outbox.enqueue("normal-1", b"n" * 1000, ["hard_brake"])
    outbox.enqueue("normal-2", b"m" * 1000, ["lane_change"])  # over the cap: quiet-1 goes
    return outbox.status()


def test_a_record_carries_the_outbox_and_it_is_published_per_car(car_outbox, instance, local_lake):
    (vin,) = fleet_vins(1)
    (record,) = records_for(SHA, [vin], frames=20)
    record.update(outbox_fields(car_outbox))
    assert record["outbox_evictions"] == 1 and record["outbox_held_logs"] == 0
    assert record["outbox_backlog_logs"] == 2  # normal-1 and normal-2 wait for a drain
    assert record["outbox_bytes_sent_by_class"] == {"urgent": 1000, "normal": 15}
    assert check_record(record, SETTINGS) == []

    landed = land_telemetry(local_lake, "obx", [record])
    instance.add_dynamic_partitions(telemetry_batches.name, [landed.branch])
    result = dg.materialize(
        [fleet_telemetry],
        instance=instance,
        resources={
            "lake": local_lake,
            "io_manager": LakeIOManager(lake=local_lake),
            "anonymization": AnonymizationKey(key_hex=ANON_KEY_HEX),
        },
        partition_key=landed.branch,
    )
    (event,) = result.get_asset_materialization_events()
    table = event.materialization.metadata["outbox_by_vehicle"].value
    assert "outbox_backlog_logs" in table and "veh-" in table
    published = pd.read_parquet(
        io.BytesIO(local_lake.get_object(MAIN_BRANCH, telemetry_records_key(landed.branch)))
    )
    row = published.iloc[0]
    assert row["outbox_evictions"] == 1 and row["outbox_backlog_bytes"] == 2000
    assert json.loads(row["outbox_bytes_sent_by_class"]) == {"normal": 15, "urgent": 1000}


def test_records_without_the_outbox_still_publish_with_defaults():
    (vin,) = fleet_vins(1)
    (record,) = records_for(SHA, [vin])
    assert not set(OUTBOX_DEFAULTS) & set(record)
    assert check_record(record, SETTINGS) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("outbox_evictions", -1),
        ("outbox_backlog_logs", "3"),
        ("outbox_bytes_sent_by_class", {"urgent": -5}),
        ("outbox_bytes_sent_by_class", [1, 2]),
    ],
)
def test_a_bad_outbox_field_is_a_reason(field, value):
    (vin,) = fleet_vins(1)
    (record,) = records_for(SHA, [vin])
    record[field] = value
    codes = [code for code, _ in check_record(record, SETTINGS)]
    assert codes and set(codes) <= {"invalid_count", "invalid_field"}
