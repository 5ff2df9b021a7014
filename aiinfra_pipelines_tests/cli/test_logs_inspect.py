"""``aiinfra logs inspect``: a recording checked before upload, as a table or one JSON object."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import write_drive_log
from aiinfra_pipelines_tests.support.ros2_bags import write_ros2_bag
from aiinfra_pipelines_tests.support.ros2_recording import write_ros2_recording

runner = CliRunner()


def _inspect(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["logs", "inspect", *args], terminal_width=200)
    return result.exit_code, result.output


def test_a_ros2_recording_is_reported_accepted_with_its_channels_and_sensors(tmp_path) -> None:
    path = tmp_path / "car.mcap"
    path.write_bytes(write_ros2_recording())
    code, output = _inspect(str(path), "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["accepted"] is True and report["reasons"] == []
    assert report["profile"] == "ros2" and report["frames"] == 20
    channels = {row["topic"]: row for row in report["channels"]}
    assert channels["/gnss/fix"]["rate_hz"] == 5.0
    assert channels["/vehicle/status"]["encoding"] == "json"
    roles = {sensor["role"] for sensor in report["sensors"]}
    assert {"front_camera", "front_camera_calibration", "lidar", "gnss", "pose"} <= roles
    code, table = _inspect(str(path))
    assert code == 0 and "accepted" in table and "/lidar/points" in table


def test_a_stock_ros2_bag_reports_where_each_signal_came_from(tmp_path) -> None:
    path = tmp_path / "bag.mcap"
    path.write_bytes(write_ros2_bag("autoware"))
    code, output = _inspect(str(path), "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["accepted"] is True and report["profile"] == "ros2"
    sources = report["signal_sources"]
    assert sources["brake"] == "/from_can_bus CAN 0x1A0 brake"
    assert sources["latitude"] == "unknown"
    assert report["derived_metadata"]["vin"] == "unknown"
    assert report["metadata"]["log_id"].startswith("ros2-")
    # The keys a simulated log had before stay as they were; the new ones are added.
    assert {"metadata", "sensors", "derived_conditions", "channels"} <= set(report)


def test_a_refused_recording_exits_1_with_every_reason(tmp_path) -> None:
    path = tmp_path / "bad.mcap"
    path.write_bytes(write_ros2_recording(calibration=False, bad_cloud=True))
    code, output = _inspect(str(path), "--json")
    assert code == 1
    report = json.loads(output)
    assert report["accepted"] is False
    codes = [reason["code"] for reason in report["reasons"]]
    assert codes == ["missing_calibration", "bad_point_cloud"]
    code, table = _inspect(str(path))
    assert code == 1 and "missing_calibration" in table


def test_a_simulated_log_and_a_named_profile_that_does_not_fit(tmp_path) -> None:
    path = tmp_path / "sim.mcap"
    write_drive_log(make_synthetic_log(), path)
    code, output = _inspect(str(path), "--json")
    assert code == 0 and json.loads(output)["profile"] == "simulated"
    code, output = _inspect(str(path), "--source", "ros2", "--json")
    assert code == 1
    assert json.loads(output)["reasons"][0]["code"] == "unknown_source"


def test_garbage_is_refused_not_a_traceback(tmp_path) -> None:
    path = tmp_path / "garbage.mcap"
    path.write_bytes(b"not an mcap file at all")
    code, output = _inspect(str(path), "--json")
    assert code == 1
    report = json.loads(output)
    assert report["reasons"][0]["code"] == "not_mcap" and report["channels"] == []


def test_a_simulated_fleet_log_reports_both_cameras_and_the_lidar(tmp_path) -> None:
    from aiinfra_pipelines_tests.support.fleet_rig import healthy_logs

    path = tmp_path / "fleet.mcap"
    write_drive_log(healthy_logs()[0], path)
    code, output = _inspect(str(path), "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["accepted"] is True and report["profile"] == "simulated"
    sensors = {sensor["role"]: sensor for sensor in report["sensors"]}
    assert (
        sensors["front_camera"]["schema"]
        == sensors["rear_camera"]["schema"]
        == ("foxglove.CompressedImage")
    )
    assert {"front_camera_calibration", "rear_camera_calibration"} <= set(sensors)
    assert sensors["lidar"]["schema"] == "foxglove.PointCloud"
    assert sensors["lidar"]["points_mean"] >= 0
    code, table = _inspect(str(path))
    assert code == 0 and "/camera/rear" in table and "/lidar/points" in table


def test_pii_findings_are_reported_before_and_after_the_cars_anonymizer(tmp_path) -> None:
    """The cloud's check, as ingest runs it, on a file an engineer holds."""
    raw = tmp_path / "raw.mcap"
    write_drive_log(make_synthetic_log(n_frames=10, seed=4, vehicle_anonymized=False), raw)
    code, output = _inspect(str(raw), "--json")
    assert code == 1
    report = json.loads(output)
    findings = report["pii_findings"]
    assert findings["count"] == 30 == len(findings["regions"])
    assert findings["frames"] == list(range(10))
    region = findings["regions"][0]
    assert set(region) >= {"frame_index", "camera", "box", "kind", "found_by", "contrast"}
    assert region["kind"] == "plate" and len(region["box"]) == 4
    assert "residual_pii" in [reason["code"] for reason in report["reasons"]]

    blurred = tmp_path / "blurred.mcap"
    write_drive_log(make_synthetic_log(n_frames=10, seed=4), blurred)
    code, output = _inspect(str(blurred), "--json")
    assert code == 0, output
    assert json.loads(output)["pii_findings"] == {"count": 0, "frames": [], "regions": []}
