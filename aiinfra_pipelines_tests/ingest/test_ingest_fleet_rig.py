"""The simulated fleet's full-rig logs through ingestion: JPEG cameras and LiDAR reach the lake,
the front camera as the same rgb8 frame, the calibration hash in the scene index; the car with
a skewed clock is quarantined with the measured skew."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines_tests.support.fleet_rig import healthy_logs, skewed_logs
from aiinfra_pipelines_tests.support.ingest_runs import (
    land,
    materialize_partition,
    partition_of,
    verdicts_of,
)

pytestmark = pytest.mark.timeout(300)


def test_fleet_rig_logs_are_indexed_with_their_calibration_hash_and_skew_is_quarantined(
    local_lake, instance, ingest_resources
) -> None:
    good, skewed = healthy_logs(), skewed_logs()
    assert good and skewed
    batch = land(local_lake, "rig-a", [(log.log_id, log) for log in (*good, *skewed)])

    result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success
    verdicts = verdicts_of(result)
    assert {verdicts[f"logs/{log.log_id}.mcap"] for log in good} == {"accepted"}
    assert {verdicts[f"logs/{log.log_id}.mcap"] for log in skewed} == {"quarantined"}
    assert all(check.passed for check in result.get_asset_check_evaluations())

    index = scene_index_view(local_lake)
    expected = {validate_drive_log(encode_drive_log(log)).calibration_sha256 for log in good}
    assert len(expected) == 1 and len(next(iter(expected))) == 64
    assert set(index["calibration_sha256"]) == expected
    assert set(index["sensor_config_version"]) == {
        log.metadata["sensor_config_version"] for log in good
    }
    assert index.groupby("log_id").size().to_dict() == {log.log_id: len(log.frames) for log in good}
    assert (index["lidar_point_count"] >= 0).all()

    quarantine = quarantine_view(local_lake).set_index("log_key")
    for log in skewed:
        row = quarantine.loc[f"logs/{log.log_id}.mcap"]
        assert row["reason_codes"].split(",") == ["clock_skew"]
        assert "+120.0 ms" in row["reasons"]

    first = good[0]
    key = index.loc[index["log_id"] == first.log_id, "frames_object"].iloc[0]
    frames = pd.read_parquet(io.BytesIO(local_lake.get_object(MAIN_BRANCH, key)))
    front, rear = first.frames[0].image, first.frames[0].rear_image
    assert frames["image_encoding"].unique().tolist() == ["rgb8"]
    assert set(frames["image_height"]) == {front.shape[0]}
    assert set(frames["image_width"]) == {front.shape[1]}
    image = np.frombuffer(frames["image"].iloc[0], np.uint8).reshape(front.shape)
    assert np.abs(image.astype(int) - front.astype(int)).mean() < 8.0  # the decoded JPEG
    assert set(frames["rear_image_width"]) == {rear.shape[1]}
    assert {len(blob) for blob in frames["rear_image"]} == {rear.size}
    counts = [len(frame.lidar_points) for frame in first.frames]
    assert frames["lidar_point_count"].tolist() == counts
    assert [len(blob) for blob in frames["lidar_points"]] == [12 * n for n in counts]
