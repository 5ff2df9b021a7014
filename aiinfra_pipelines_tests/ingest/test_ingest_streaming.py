"""Ingest streams a log through its worker: payloads left in the downloaded file, frames
anonymized and written a row group at a time, and what lands is what the in-memory path gives."""

from __future__ import annotations

import io
import math

import pandas as pd
import pyarrow.parquet as pq
import pytest

from aiinfra_pipelines.ingest.tables import frames_table
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.fleet_rig import healthy_logs
from aiinfra_pipelines_tests.support.ingest_runs import (
    land,
    materialize_partition,
    partition_of,
    verdicts_of,
)

pytestmark = pytest.mark.timeout(300)

PER_GROUP = 4


def test_a_streamed_log_lands_as_the_in_memory_path_would_write_it(
    local_lake, instance, ingest_resources, tmp_path
) -> None:
    log = healthy_logs()[0]
    batch = land(local_lake, "stream-a", [(log.log_id, log)])
    overlay = {
        "logs.yaml": {"reader": {"deferred_payload_bytes": 64, "chunk_cache_bytes": 1}},
        "ingest.yaml": {"streaming": {"frames_per_row_group": PER_GROUP}},
    }
    with resources_with(tmp_path / "resources", overlay):
        result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success
    assert verdicts_of(result) == {f"logs/{log.log_id}.mcap": "accepted"}
    assert all(check.passed for check in result.get_asset_check_evaluations())  # PII audit too
    (frames_object,) = set(scene_index_view(local_lake)["frames_object"])
    stored = local_lake.get_object(MAIN_BRANCH, frames_object)
    assert pq.ParquetFile(io.BytesIO(stored)).num_row_groups == math.ceil(
        len(log.frames) / PER_GROUP
    )
    key = bytes.fromhex(ingest_resources["anonymization"].key_hex)
    expected = frames_table(anonymize_log(read_drive_log(encode_drive_log(log)), key))
    pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(stored)), expected)
