"""OTA: the TUF repository ``ota_release`` publishes, as vehicles see it through tuf.ngclient."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from aiinfra_pipelines.fleet.vehicles import Vehicle, build_fleet
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine
from aiinfra_pipelines.release.assets_ota import ota_release
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.cohorts import in_cohort
from aiinfra_pipelines.release.keys import ReleaseKeys, private_key_pem
from aiinfra_pipelines.release.ota import (
    TufSettings,
    metadata_key,
    plan_offers,
    root_metadata,
    stored_target_key,
    target_path,
)
from aiinfra_pipelines.release.ota_client import OtaVerificationError, VehicleUpdater
from aiinfra_pipelines.release.ota_signing import publish_ota_repository
from aiinfra_pipelines_tests.support.release_lake import (
    SHIP_TARGET,
    onnx_pair,
    publish_candidate,
    set_production,
    set_rollout,
    tamper,
)

SALT = "rollout-2-salt"


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory) -> ReleaseKeys:
    return ReleaseKeys(dev_keys_dir=str(tmp_path_factory.mktemp("keys")))


@pytest.fixture(scope="module")
def fleet() -> list[Vehicle]:
    return build_fleet(12)


def certified(lake, keys: ReleaseKeys, version: str, seed: int) -> dict:
    manifest = publish_candidate(lake, version, seed=seed)
    certify_candidate(lake, version, keys.certificate_signer(), root_run_id=f"certify-{version}")
    return manifest


def release(instance, lake, keys, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [ota_release],
        instance=instance,
        resources={"lake": lake, "release_keys": keys},
        raise_on_error=raise_on_error,
    )


def vehicle(lake, car: Vehicle, cache: Path, trusted_root: bytes) -> VehicleUpdater:
    return VehicleUpdater(
        lake,
        vin=car.vin,
        vehicle_model=car.model,
        engine_target=SHIP_TARGET,
        trusted_root=trusted_root,
        cache_dir=cache / car.vin,
    )


def test_vehicles_download_and_verify_the_certified_production_engine(
    instance, local_lake, release_keys, fleet, tmp_path
):
    manifest = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, manifest)

    result = release(instance, local_lake, release_keys)

    assert result.success
    metadata = result.asset_materializations_for_node("ota_release")[0].metadata
    assert metadata["versions"].value == {"root": 1, "targets": 1, "snapshot": 1, "timestamp": 1}
    assert metadata["engines"].value == {"production": "1"}
    trusted_root = root_metadata(local_lake, version=1)
    for car in fleet[:2]:  # one of each vehicle model
        engine = vehicle(local_lake, car, tmp_path, trusted_root).update()
        assert (engine.channel, engine.model_version) == ("production", "1")
        assert engine.sha256 == manifest["ship"]["sha256"]
        assert engine.read_bytes() == onnx_pair(1)[1]
        assert engine.custom["vehicle_model"] == car.model
        loaded = OnnxRuntimeEngine(engine.read_bytes(), perception_spec())
        assert loaded.sha256 == engine.sha256
    assert {car.model for car in fleet[:2]} == {"sedan-a", "suv-b"}


def test_candidate_reaches_its_cohort_only_and_a_rollback_withdraws_it(
    instance, local_lake, release_keys, fleet, tmp_path
):
    production = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, production)
    candidate = certified(local_lake, release_keys, "2", seed=2)
    set_rollout(local_lake, candidate, status="in_progress", cohort_percent=50.0, salt=SALT)

    result = release(instance, local_lake, release_keys)

    assert result.asset_materializations_for_node("ota_release")[0].metadata["engines"].value == {
        "production": "1",
        "candidate": "2",
    }
    trusted_root = root_metadata(local_lake, version=1)
    expected = {car.vin: "2" if in_cohort(car.vin, 50.0, SALT) else "1" for car in fleet}
    assert set(expected.values()) == {"1", "2"}, "12 cars at 50% should split"
    for car in fleet:
        engine = vehicle(local_lake, car, tmp_path, trusted_root).update()
        assert engine.model_version == expected[car.vin], car.vin
        assert engine.custom["channel"] == (
            "candidate" if expected[car.vin] == "2" else "production"
        )
        if engine.channel == "candidate":
            assert engine.custom["cohort_percent"] == "50.0"
            assert engine.custom["cohort_salt"] == SALT

    # Telemetry breached: the rollout layer rolls back; the next metadata lists production only.
    set_rollout(
        local_lake,
        candidate,
        status="rolled_back",
        cohort_percent=50.0,
        salt=SALT,
        previous_production="1",
    )
    after = release(instance, local_lake, release_keys)
    versions = after.asset_materializations_for_node("ota_release")[0].metadata["versions"].value
    assert versions["targets"] == 2 and versions["timestamp"] == 2
    for car in fleet:
        assert vehicle(local_lake, car, tmp_path, trusted_root).update().model_version == "1"


def test_a_tampered_engine_file_is_rejected(instance, local_lake, release_keys, fleet, tmp_path):
    manifest = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, manifest)
    release(instance, local_lake, release_keys)
    car = fleet[0]
    path = target_path(car.model, SHIP_TARGET, "production", "perception.onnx")
    stored = stored_target_key(path, manifest["ship"]["sha256"])
    original = local_lake.get_object("main", stored)
    tamper(local_lake, stored, original[:-1] + bytes([original[-1] ^ 0xFF]))

    with pytest.raises(OtaVerificationError, match="LengthOrHashMismatchError"):
        vehicle(local_lake, car, tmp_path, root_metadata(local_lake, version=1)).update()
    assert not any((tmp_path / car.vin / "targets").iterdir()), "nothing may be installed"


def test_stale_timestamp_is_rejected_until_a_fresh_one_is_signed(
    instance, local_lake, release_keys, fleet, tmp_path
):
    manifest = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, manifest)
    offers = plan_offers(local_lake, release_keys.certificate_public_key())
    two_days_ago = datetime.now(UTC) - timedelta(days=2)  # timestamp expiry is 1 day
    assert TufSettings.load().expiry["timestamp"] < timedelta(days=2)
    publish_ota_repository(
        local_lake, release_keys, offers, root_run_id="ota-old", now=two_days_ago
    )
    car = fleet[0]
    trusted_root = root_metadata(local_lake, version=1)

    with pytest.raises(OtaVerificationError, match="ExpiredMetadataError: timestamp"):
        vehicle(local_lake, car, tmp_path, trusted_root).update()

    release(instance, local_lake, release_keys)  # re-signs the timestamp (version 2)
    assert vehicle(local_lake, car, tmp_path, trusted_root).update().model_version == "1"


def test_rollback_to_older_metadata_is_rejected(
    instance, local_lake, release_keys, fleet, tmp_path
):
    production = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, production)
    release(instance, local_lake, release_keys)
    old_timestamp = local_lake.get_object("main", metadata_key("timestamp", 1))
    release(instance, local_lake, release_keys)
    car = fleet[0]
    trusted_root = root_metadata(local_lake, version=1)
    assert vehicle(local_lake, car, tmp_path, trusted_root).update().model_version == "1"

    # An attacker (or a stale mirror) serves the older, still validly signed timestamp.
    tamper(local_lake, metadata_key("timestamp"), old_timestamp)
    with pytest.raises(OtaVerificationError, match="BadVersionNumberError"):
        vehicle(local_lake, car, tmp_path, trusted_root).update()

    # The repository itself never reuses a version: it continues from its history.
    result = release(instance, local_lake, release_keys)
    versions = result.asset_materializations_for_node("ota_release")[0].metadata["versions"].value
    assert versions["timestamp"] == 3
    assert vehicle(local_lake, car, tmp_path, trusted_root).update().model_version == "1"


def test_an_uncertified_engine_is_refused(instance, local_lake, release_keys):
    manifest = publish_candidate(local_lake, "1", seed=1)  # published, never certified
    set_production(local_lake, manifest)

    result = release(instance, local_lake, release_keys, raise_on_error=False)

    assert not result.success
    failure = result.failure_data_for_node("ota_release")
    assert "production model version 1: model version 1 is not certified" in (
        failure.user_failure_data.description
    )
    assert not local_lake.list_objects("main", "ota/"), "nothing may be signed or published"


def test_a_candidate_whose_certificate_no_longer_holds_is_refused(
    instance, local_lake, release_keys
):
    production = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, production)
    candidate = certified(local_lake, release_keys, "2", seed=2)
    set_rollout(local_lake, candidate, status="in_progress", cohort_percent=1.0)
    report_key = candidate["reports"]["engine_parity"]["key"]
    forged = json.loads(local_lake.get_object("main", report_key)) | {"max_drop": 0.0}
    tamper(local_lake, report_key, json.dumps(forged).encode())

    result = release(instance, local_lake, release_keys, raise_on_error=False)

    description = result.failure_data_for_node("ota_release").user_failure_data.description
    assert "candidate model version 2" in description and "engine_parity" in description
    assert "production model version 1" not in description


def test_rotated_targets_keys_and_threshold_two_are_followed_by_vehicles(
    local_lake, release_keys, fleet, tmp_path
):
    manifest = certified(local_lake, release_keys, "1", seed=1)
    set_production(local_lake, manifest)
    offers = plan_offers(local_lake, release_keys.certificate_public_key())
    first = publish_ota_repository(local_lake, release_keys, offers, root_run_id="ota-1")
    car = fleet[1]
    trusted_root = root_metadata(local_lake, version=1)
    assert vehicle(local_lake, car, tmp_path, trusted_root).update().model_version == "1"

    # The targets role moves to two new keys with threshold 2 (same root key): root v2.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    new_targets = b"".join(private_key_pem(Ed25519PrivateKey.generate()) for _ in range(2))
    rotated = release_keys.model_copy(update={"tuf_targets_key": new_targets.decode()})
    base = TufSettings.load()
    settings = base.__class__(
        thresholds={**base.thresholds, "targets": 2},
        expiry=base.expiry,
        renew_when_remaining=base.renew_when_remaining,
        consistent_snapshot=base.consistent_snapshot,
    )
    second = publish_ota_repository(local_lake, rotated, offers, root_run_id="ota-2", tuf=settings)

    assert first.versions["root"] == 1 and second.versions["root"] == 2
    assert second.resigned == ["root", "targets", "snapshot", "timestamp"]
    root_v2 = json.loads(root_metadata(local_lake))["signed"]
    assert root_v2["roles"]["targets"]["threshold"] == 2
    assert len(root_v2["roles"]["targets"]["keyids"]) == 2
    # The car still holds root v1 from the factory and walks the rotation to v2.
    engine = vehicle(local_lake, car, tmp_path, trusted_root).update()
    assert engine.model_version == "1"
    assert (tmp_path / car.vin / "metadata" / "root_history" / "2.root.json").exists()
