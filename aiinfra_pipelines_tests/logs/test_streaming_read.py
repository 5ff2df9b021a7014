"""The streaming read (ingest's): payloads left in the file, frames decoded when read, the same
verdict and the same frames as the in-memory read, and the frames Parquet written a row group at
a time is the frames table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from aiinfra_pipelines.ingest.tables import PAYLOAD_COLUMNS, frames_table, write_frames_parquet
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.lazy_frames import NO_IMAGE, LazyFrames, signal_frames
from aiinfra_pipelines.logs.model import TOPIC_CAMERA, TOPIC_LIDAR, TOPIC_REAR_CAMERA
from aiinfra_pipelines.logs.payloads import DeferredMessage
from aiinfra_pipelines.logs.reader import read_drive_log, scan_mcap
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.fleet_rig import healthy_logs

pytestmark = pytest.mark.timeout(180)

KEY = b"k" * 32


@pytest.fixture
def deferring(tmp_path):
    """Every payload over 64 B left in the file (the shipped 32 kB would keep the test rig's
    small images in memory, and nothing would be deferred), and a cache of one chunk."""
    overlay = {"logs.yaml": {"reader": {"deferred_payload_bytes": 64, "chunk_cache_bytes": 1}}}
    with resources_with(tmp_path / "resources", overlay):
        yield


@pytest.fixture(scope="module")
def rig_file(tmp_path_factory) -> tuple[Path, bytes]:
    data = encode_drive_log(healthy_logs()[0])
    path = tmp_path_factory.mktemp("rig") / "log.mcap"
    path.write_bytes(data)
    return path, data


def _same_frames(lazy, eager) -> None:
    assert len(lazy) == len(eager) > 0
    for a, b in zip(lazy, eager, strict=True):
        assert a.timestamp_ns == b.timestamp_ns
        assert (a.latitude, a.speed_mps, a.others) == (b.latitude, b.speed_mps, b.others)
        for name in ("image", "rear_image", "lidar_points"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_the_streaming_scan_keeps_large_payloads_in_the_file(deferring, rig_file) -> None:
    path, data = rig_file
    streamed, in_memory = scan_mcap(path, deferred=True), scan_mcap(data)
    for topic in (TOPIC_CAMERA, TOPIC_REAR_CAMERA, TOPIC_LIDAR):
        deferred = streamed.messages[topic]
        assert deferred and all(isinstance(m, DeferredMessage) for m in deferred)
        # read back from the file, byte for byte what the in-memory scan holds
        assert [m.data for m in deferred] == [m.data for m in in_memory.messages[topic]]
    assert streamed.sha256 == in_memory.sha256


def test_streaming_validation_gives_the_in_memory_verdict_and_frames(deferring, rig_file) -> None:
    path, data = rig_file
    streamed, in_memory = validate_drive_log(path, streaming=True), validate_drive_log(data)

    assert streamed.accepted and in_memory.accepted, streamed.reasons
    assert isinstance(streamed.log.frames, LazyFrames)
    assert (streamed.metadata, streamed.sensors) == (in_memory.metadata, in_memory.sensors)
    assert streamed.calibration_sha256 == in_memory.calibration_sha256
    _same_frames(streamed.log.frames, in_memory.log.frames)
    # signal checks read skeletons: no pixels held, nothing decoded
    assert all(frame.image is NO_IMAGE for frame in signal_frames(streamed.log.frames))
    assert streamed.log.duration_s == in_memory.log.duration_s
    assert streamed.log.frames[-1].timestamp_ns == in_memory.log.frames[-1].timestamp_ns


def test_a_lazy_log_anonymizes_as_each_frame_is_read(deferring, rig_file) -> None:
    path, data = rig_file
    lazy = anonymize_log(read_drive_log(path, streaming=True), KEY)
    eager = anonymize_log(read_drive_log(data), KEY)
    assert isinstance(lazy.frames, LazyFrames)
    assert lazy.metadata == eager.metadata
    _same_frames(lazy.frames, eager.frames)  # plates blurred, GPS coarsened alike
    skeleton_gps = [(f.latitude, f.longitude) for f in signal_frames(lazy.frames)]
    assert skeleton_gps == [(f.latitude, f.longitude) for f in eager.frames]


@pytest.mark.parametrize("per_group", [1, 4, 1000])
def test_frames_parquet_written_a_row_group_at_a_time_is_the_frames_table(
    deferring, rig_file, tmp_path, per_group: int
) -> None:
    path, data = rig_file
    lazy = anonymize_log(read_drive_log(path, streaming=True), KEY)
    expected = frames_table(anonymize_log(read_drive_log(data), KEY))
    target = tmp_path / "frames.parquet"

    signals = write_frames_parquet(lazy, target, per_group)

    written = pq.ParquetFile(target)
    assert written.num_row_groups == math.ceil(len(expected) / per_group)
    pd.testing.assert_frame_equal(written.read().to_pandas(), expected)
    pd.testing.assert_frame_equal(signals, expected.drop(columns=list(PAYLOAD_COLUMNS)))


def test_a_row_group_size_below_one_is_refused(rig_file, tmp_path) -> None:
    log = anonymize_log(read_drive_log(rig_file[1]), KEY)
    with pytest.raises(ValueError, match="frames_per_row_group must be at least 1"):
        write_frames_parquet(log, tmp_path / "x.parquet", 0)
