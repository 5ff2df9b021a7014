"""The fleet on the shared closed-loop runner: ground-truth logs unchanged, a rollout cohort
driving with an engine (its version in the logs), and per-episode telemetry from every drive."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import EpisodeDrive, drive_fleet
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines_tests.support.simulation_engines import brightness_onnx, perception_net_onnx

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def small_config():
    short = {"max_duration_s": 3}
    return with_overrides(
        None,
        {
            "simulation": {
                "road_types": {
                    "highway": {"max_duration_s": 3, "env_config": {"vehicles_count": 6}},
                    "merge": short,
                    "roundabout": short,
                    "intersection": short,
                }
            }
        },
    )


def test_ground_truth_drives_are_unchanged_by_the_hooks(small_config):
    plain = drive_fleet(2, 1, seed=21, config=small_config)
    drives: list[EpisodeDrive] = []
    hooked = drive_fleet(
        2,
        1,
        seed=21,
        config=small_config,
        engine_for_vehicle=lambda vehicle: None,
        on_episode=drives.append,
    )
    assert [encode_drive_log(log) for log in plain] == [encode_drive_log(log) for log in hooked]
    assert [d.vehicle.index for d in drives] == [0, 1]
    for drive in drives:
        assert drive.metrics.perception_source == "ground_truth"
        assert drive.metrics.engine_name == "" and drive.metrics.fallback_steps == 0
        assert [log.log_id for log in drive.logs] == [
            log.log_id for log in hooked if log.metadata["vin"] == drive.vehicle.vin
        ]


def test_a_cohort_drives_with_the_engine_and_says_so(small_config):
    engine = OnnxRuntimeEngine(brightness_onnx(), perception_spec(), name="7", batch_size=1)
    drives: list[EpisodeDrive] = []
    logs = drive_fleet(
        2,
        1,
        seed=21,
        config=small_config,
        engine_for_vehicle=lambda vehicle: engine if vehicle.index == 0 else None,
        on_episode=drives.append,
    )
    cohort, rest = drives
    assert cohort.vehicle.software_version == "7"
    assert rest.vehicle.software_version == small_config["fleet"]["default_software_version"]
    assert cohort.metrics.perception_source == "engine"
    assert cohort.metrics.engine_sha256 == engine.sha256
    assert len(cohort.metrics.perception_ms) == cohort.metrics.steps > 0
    assert len(cohort.metrics.confidence) == cohort.metrics.steps
    assert cohort.logs and rest.logs
    assert {log.metadata["software_version"] for log in cohort.logs} == {"7"}
    assert {log.metadata["software_version"] for log in rest.logs} == {"rule-planner-0"}
    assert [log.log_id for log in logs] == [log.log_id for d in drives for log in d.logs]
    for log in logs:  # engine-driven logs still pass ingest validation
        report = validate_drive_log(encode_drive_log(log))
        assert report.accepted, report.reasons


def test_shadow_mode_plans_on_the_same_frames_and_never_acts(small_config):
    """A car running an engine in shadow: same drive, and how often the shadow would agree."""
    spec = perception_spec()
    driving = OnnxRuntimeEngine(brightness_onnx(), spec, name="7", batch_size=1)
    shadow = OnnxRuntimeEngine(perception_net_onnx(seed=2), spec, name="8", batch_size=1)

    def drive(shadow_engine):
        drives: list[EpisodeDrive] = []
        logs = drive_fleet(
            1,
            1,
            seed=23,
            config=small_config,
            engine_for_vehicle=lambda vehicle: driving,
            on_episode=drives.append,
            shadow_for_vehicle=lambda vehicle: shadow_engine,
        )
        return logs, drives[0].metrics

    plain_logs, plain = drive(None)
    self_logs, itself = drive(driving)
    other_logs, other = drive(shadow)
    # The shadow engine never changes what the car does.
    encoded = [encode_drive_log(log) for log in plain_logs]
    assert [encode_drive_log(log) for log in self_logs] == encoded
    assert [encode_drive_log(log) for log in other_logs] == encoded
    assert plain.shadow_steps == 0 and plain.shadow_engine_sha256 == ""
    # The driving engine in its own shadow agrees on every step; another network need not.
    assert itself.shadow_steps == itself.steps > 0
    assert itself.shadow_agreements == itself.shadow_steps
    assert other.shadow_engine_sha256 == shadow.sha256 and other.shadow_steps == other.steps
    assert 0 <= other.shadow_agreements <= other.shadow_steps
