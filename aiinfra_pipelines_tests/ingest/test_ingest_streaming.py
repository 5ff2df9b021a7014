"""Ingest streams a log through its worker: payloads left in the downloaded file, frames
anonymized and written a row group at a time, and what lands is what the in-memory path gives."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

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
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "large_log.py"


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


def _large_log_benchmark(minutes: float) -> dict:
    """``benchmarks/large_log.py`` (the real ingest path on a real-size log) as a child."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--minutes", str(minutes), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ingest_memory_does_not_grow_with_the_logs_length() -> None:
    """Four times the frames of two 1280x720 cameras, the same peak: the in-memory path grew
    ~24.5 MB a frame (180 more frames: ~4.4 GB more)."""
    short, long = _large_log_benchmark(0.1), _large_log_benchmark(0.4)

    for run, frames in ((short, 60), (long, 240)):
        assert run["outcome"] == "ingested", run
        assert run["verdicts"] == ["accepted"] and run["accepted_frames"] == frames
        assert run["pii_leaks"] == 0
    assert long["peak_rss_mb"] - short["peak_rss_mb"] < 150, (short, long)
