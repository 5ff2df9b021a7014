"""A real car's recordings through ingestion: a ROS 2 log reaches the scene index; broken ones
are quarantined with their own reason, kept byte for byte on their branch, never merged. Bags
as the stock ROS 2 recorder writes them (no drive_log record, signals unknown where the car has
no source) are indexed with their unknowns as NaN and ``unknown``, and every audit passes."""

from __future__ import annotations

import hashlib

from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX
from aiinfra_pipelines_tests.support.foxglove_recording import write_foxglove_recording
from aiinfra_pipelines_tests.support.ingest_runs import (
    land,
    materialize_partition,
    partition_of,
    verdicts_of,
)
from aiinfra_pipelines_tests.support.ros2_bags import write_ros2_bag
from aiinfra_pipelines_tests.support.ros2_recording import write_ros2_recording


def test_ros2_and_foxglove_uploads_are_indexed_and_broken_logs_quarantined(
    local_lake, instance, ingest_resources
) -> None:
    broken = {
        "no-calibration": (write_ros2_recording(calibration=False), "missing_calibration"),
        "bad-jpeg": (write_ros2_recording(bad_jpeg_at=3), "bad_image"),
        "bad-cloud": (write_ros2_recording(bad_cloud=True), "bad_point_cloud"),
        "gnss-as-imu": (
            write_ros2_recording(gnss_schema="sensor_msgs/msg/Imu"),
            "wrong_schema",
        ),
    }
    good = write_ros2_recording(n_frames=24)
    foxglove = write_foxglove_recording(n_frames=16)
    batch = land(
        local_lake,
        "ros2-a",
        [("car", good), ("fox", foxglove), *((name, data) for name, (data, _) in broken.items())],
    )

    result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success
    verdicts = verdicts_of(result)
    assert verdicts["logs/car.mcap"] == verdicts["logs/fox.mcap"] == "accepted"
    assert {verdicts[f"logs/{name}.mcap"] for name in broken} == {"quarantined"}
    index = scene_index_view(local_lake)
    assert index.groupby("log_key").size().to_dict() == {"logs/car.mcap": 24, "logs/fox.mcap": 16}
    assert set(index["slice"]) == {"day/clear/highway"}
    assert index["vehicle_pseudonym"].str.fullmatch(r"veh-[0-9a-f]{16}").all()
    quarantine = quarantine_view(local_lake).set_index("log_key")
    for name, (data, code) in broken.items():
        assert code in quarantine.loc[f"logs/{name}.mcap", "reason_codes"].split(",")
        assert local_lake.get_object(batch.branch, f"logs/{name}.mcap") == data
    assert all(check.passed for check in result.get_asset_check_evaluations())
    assert not local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)


def test_stock_ros2_bags_in_two_layouts_reach_the_scene_index_with_their_unknowns(
    local_lake, instance, ingest_resources
) -> None:
    bags = {"generic": write_ros2_bag("generic"), "autoware": write_ros2_bag("autoware", 16)}
    refused = write_ros2_bag("generic", nan_speed_at=3)  # NaN in a signal the bag carries
    batch = land(local_lake, "ros2-bags", [*bags.items(), ("nan-speed", refused)])

    result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success
    verdicts = verdicts_of(result)
    assert verdicts["logs/generic.mcap"] == verdicts["logs/autoware.mcap"] == "accepted"
    assert verdicts["logs/nan-speed.mcap"] == "quarantined"
    index = scene_index_view(local_lake)
    assert index.groupby("log_key").size().to_dict() == {
        "logs/autoware.mcap": 16,
        "logs/generic.mcap": 20,
    }
    rows = {key: part for key, part in index.groupby("log_key")}
    generic, autoware = rows["logs/generic.mcap"], rows["logs/autoware.mcap"]
    digest = hashlib.sha256(bags["generic"]).hexdigest()[:16]
    assert set(generic["log_id"]) == {f"ros2-{digest}"}
    assert set(index["vehicle_pseudonym"]) == {"unknown"}
    assert set(index["vehicle_model"]) == {"unknown"}
    assert set(index["slice"]) == {"day/unknown/unknown"}
    # Unknown signals are NaN; what each bag carries is there.
    assert generic["brake"].isna().all() and generic["steering_rad"].isna().all()
    assert generic["speed_mps"].notna().all() and generic["latitude"].notna().all()
    assert autoware["latitude"].isna().all() and autoware["longitude"].isna().all()
    assert autoware[["speed_mps", "steering_rad", "brake", "accel_mps2"]].notna().all().all()
    quarantine = quarantine_view(local_lake).set_index("log_key")
    assert quarantine.loc["logs/nan-speed.mcap", "reason_codes"] == "non_finite_signal"
    # The PII audit re-reads each raw bag, and every expectation suite passes.
    assert all(check.passed for check in result.get_asset_check_evaluations())
    assert not local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
