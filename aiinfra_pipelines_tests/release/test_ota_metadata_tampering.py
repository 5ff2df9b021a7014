"""TUF metadata tampering: a vehicle refuses bad signatures, a snapshot that does not match
targets and a rollback of targets, and keeps what it already trusted.

One repository is built once by our own release code (certify, production pointer,
``publish_ota_repository``): engine 1 is published (every role v1), a car updates and trusts
it, then engine 2 is published (targets, snapshot and timestamp v2). Each test copies that lake
and the car's TUF cache, forges one metadata file with python-tuf's ``Metadata`` API the way an
attacker with write access to the lake (and, where a test says so, some of the repository's
keys) would, and updates the car through the real ``VehicleUpdater``: it must refuse with
``OtaVerificationError`` (tuf's reason attached), install nothing and keep its targets
metadata. Then it must recover: with the genuine file put back or, where the forgery was signed
with a leaked role key (so tuf stored it), once the repository rotates that key. A control test
shows the same forgeries are accepted when the role's key signs the final body, so refusals
come from what each test breaks. Expiry, a tampered engine file and a rollback of the whole
repository (an old timestamp) are covered in ``test_ota.py``.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions
from tuf.api.metadata import Metadata, MetaFile, Signed
from tuf.api.serialization.json import JSONSerializer

from aiinfra_pipelines.fleet.vehicles import Vehicle, build_fleet
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.keys import ReleaseKeys, private_key_pem
from aiinfra_pipelines.release.ota import metadata_key, plan_offers
from aiinfra_pipelines.release.ota_client import OtaVerificationError, VehicleUpdater
from aiinfra_pipelines.release.ota_signing import publish_ota_repository
from aiinfra_pipelines_tests.support.release_lake import (
    SHIP_TARGET,
    publish_candidate,
    set_production,
    tamper,
)

ROLES = ("root", "timestamp", "snapshot", "targets")
# Where the car fetches each role's newest version after engine 2 is published: timestamp
# unversioned, snapshot and targets by the version the role above names (consistent snapshot),
# root as the next version after the one it trusts.
SERVED = {
    "root": metadata_key("root", 2),
    "timestamp": metadata_key("timestamp"),
    "snapshot": metadata_key("snapshot", 2),
    "targets": metadata_key("targets", 2),
}
# A key the repository trusts, but for another role.
OTHER_ROLE = {
    "root": "targets",
    "timestamp": "snapshot",
    "snapshot": "timestamp",
    "targets": "root",
}


@dataclass(frozen=True)
class Published:
    """The repository and car state every test starts from (copied, never changed)."""

    folder: Path
    keys: ReleaseKeys
    car: Vehicle


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Published:
    folder = tmp_path_factory.mktemp("published")
    keys = ReleaseKeys(dev_keys_dir=str(folder / "keys"))
    lake = LocalLake(root=str(folder / "lake"))
    lake.ensure_repository()
    car = build_fleet(1)[0]
    release_engine(lake, keys, "1", seed=1)
    assert updater(lake, car, folder / "car").update().model_version == "1"
    release_engine(lake, keys, "2", seed=2)
    return Published(folder, keys, car)


def release_engine(lake: LocalLake, keys: ReleaseKeys, version: str, seed: int) -> None:
    """``version`` certified, made production and published as the OTA repository's next state."""
    manifest = publish_candidate(lake, version, seed=seed)
    certify_candidate(lake, version, keys.certificate_signer(), root_run_id=f"certify-{version}")
    set_production(lake, manifest)
    offers = plan_offers(lake, keys.certificate_public_key())
    publish_ota_repository(lake, keys, offers, root_run_id=f"ota-{version}")


def updater(lake: LocalLake, car: Vehicle, cache: Path) -> VehicleUpdater:
    return VehicleUpdater(
        lake,
        vin=car.vin,
        vehicle_model=car.model,
        engine_target=SHIP_TARGET,
        trusted_root=lake.get_object(MAIN_BRANCH, metadata_key("root", 1)),  # the factory root
        cache_dir=cache,
    )


@dataclass(frozen=True)
class Scene:
    """One test's copy of the published lake and of the car's cache."""

    lake: LocalLake
    keys: ReleaseKeys
    car: Vehicle
    cache: Path

    def vehicle(self) -> VehicleUpdater:
        return updater(self.lake, self.car, self.cache)

    def served(self, key: str) -> Metadata:
        return Metadata.from_bytes(self.lake.get_object(MAIN_BRANCH, key))

    def serve(self, key: str, metadata: Metadata) -> bytes:
        data = metadata.to_bytes(JSONSerializer(compact=False))
        tamper(self.lake, key, data)
        return data

    def signer(self, role: str) -> CryptoSigner:
        """The repository's own (dev) key for ``role``: what an attacker holding it signs with."""
        return CryptoSigner(self.keys.tuf_signers(role)[0])

    def restore(self, key: str, genuine: bytes | None) -> None:
        if genuine is None:
            self.lake.delete_object(MAIN_BRANCH, key)
            self.lake.commit(MAIN_BRANCH, f"remove forged {key}")
        else:
            tamper(self.lake, key, genuine)

    def on_disk(self) -> dict[str, bytes]:
        """The car's trusted metadata and installed targets, by path under its cache."""
        return {
            str(path.relative_to(self.cache)): path.read_bytes()
            for path in sorted(self.cache.rglob("*"))
            if path.is_file()
        }


@pytest.fixture
def scene(published: Published, tmp_path: Path) -> Scene:
    shutil.copytree(published.folder / "lake", tmp_path / "lake")
    shutil.copytree(published.folder / "car", tmp_path / "car", symlinks=True)
    lake = LocalLake(root=str(tmp_path / "lake"))
    return Scene(lake, published.keys, published.car, tmp_path / "car")


def stranger() -> CryptoSigner:
    return CryptoSigner(Ed25519PrivateKey.generate())


def newest(scene: Scene, role: str) -> Metadata:
    """What the car fetches for ``role``; for root, a next version made from the trusted one
    (the genuine repository has none: this one would be accepted if signed by the root key)."""
    if role != "root":
        return scene.served(SERVED[role])
    root = scene.served(metadata_key("root", 1))
    root.signed.version = 2
    return root


def refuse(scene: Scene, trusted: dict[str, bytes], match: str) -> tuple[type, dict[str, bytes]]:
    """Update the car, which must refuse with our error; nothing may be installed.

    Returns the kind of tuf's reason and the car's cache afterwards. The targets metadata
    (what decides installs) and every installed file stay as they were; metadata above the
    refused file that verified (a newer timestamp, say) may be stored, as TUF does.
    """
    with pytest.raises(OtaVerificationError, match=match) as refused:
        scene.vehicle().update()
    assert f"VIN {scene.car.vin}: OTA engine update refused" in str(refused.value)
    after = scene.on_disk()
    assert after["metadata/targets.json"] == trusted["metadata/targets.json"]
    installed = {path: data for path, data in after.items() if path.startswith("targets/")}
    assert installed == {p: d for p, d in trusted.items() if p.startswith("targets/")}
    assert len(installed) == 1, "still exactly the engine it trusted"
    return type(refused.value.reason), after


def accepts_genuine(scene: Scene, key: str, genuine: bytes | None) -> None:
    """Control: with the genuine file back the same car (same cache) updates to engine 2."""
    scene.restore(key, genuine)
    assert scene.vehicle().update().model_version == "2"


def rotate_keys(scene: Scene, *roles: str) -> None:
    """What operators do once ``roles``' keys leaked: new keys, so the repository signs root v2
    and re-signs every role; the car must follow it and recover."""
    fresh = {
        f"tuf_{role}_key": private_key_pem(Ed25519PrivateKey.generate()).decode() for role in roles
    }
    rotated = scene.keys.model_copy(update=fresh)
    offers = plan_offers(scene.lake, scene.keys.certificate_public_key())
    publication = publish_ota_repository(scene.lake, rotated, offers, root_run_id="ota-rotate")
    assert publication.versions["root"] == 2
    engine = scene.vehicle().update()
    assert engine.model_version == "2"
    assert (scene.cache / "metadata" / "root_history" / "2.root.json").exists()


# ------------------------------------------------------------------ 1. bad signatures
def _grant_attacker_key(signed: Signed) -> None:
    signed.add_key(stranger().public_key, "targets")  # root: the attacker may sign targets


def _extend_expiry(signed: Signed) -> None:
    signed.expires += timedelta(days=365)  # a freeze attack: keep this version valid


def _swap_engine(signed: Signed) -> None:
    engine = bytes(1000)  # the attacker's engine in place of the certified one
    for target in signed.targets.values():
        target.length = len(engine)
        target.hashes = {"sha256": hashlib.sha256(engine).hexdigest()}


BODY_CHANGES: dict[str, Callable[[Signed], None]] = {
    "root": _grant_attacker_key,
    "timestamp": _extend_expiry,
    "snapshot": _extend_expiry,
    "targets": _swap_engine,
}


@pytest.mark.parametrize("role", ROLES)
def test_control_the_same_forgery_signed_by_the_roles_key_is_accepted(
    scene: Scene, role: str
) -> None:
    """Control for the tests below: the forging itself (load, change, sign, serve) yields
    metadata the car accepts when the role's key signs the final body, so their refusals come
    from the signatures alone."""
    metadata = newest(scene, role)
    _extend_expiry(metadata.signed)
    metadata.sign(scene.signer(role))
    forged = scene.serve(SERVED[role], metadata)

    assert scene.vehicle().update().model_version == "2"
    stored = "metadata/root_history/2.root.json" if role == "root" else f"metadata/{role}.json"
    assert scene.on_disk()[stored] == forged


def _refused_as_unsigned(scene: Scene, role: str, metadata: Metadata) -> None:
    """Serve forged ``metadata`` for ``role``: the car refuses it as unsigned, stores none of
    it, keeps the role's trusted file, and accepts the genuine file once it is back."""
    trusted = scene.on_disk()
    genuine = None if role == "root" else scene.lake.get_object(MAIN_BRANCH, SERVED[role])
    forged = scene.serve(SERVED[role], metadata)

    reason, after = refuse(scene, trusted, match=f"{role} was signed by 0/1 keys")

    assert reason is exceptions.UnsignedMetadataError
    assert forged not in after.values(), "the forged metadata is never stored"
    assert after[f"metadata/{role}.json"] == trusted[f"metadata/{role}.json"]
    accepts_genuine(scene, SERVED[role], genuine)


@pytest.mark.parametrize("role", ROLES)
def test_metadata_changed_after_signing_is_refused(scene: Scene, role: str) -> None:
    metadata = newest(scene, role)
    metadata.sign(scene.signer(role))  # a valid signature by the role's own key...
    BODY_CHANGES[role](metadata.signed)  # ...over a body that then changes
    _refused_as_unsigned(scene, role, metadata)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("signed_by", ["another role's key", "a stranger's key"])
def test_metadata_signed_by_a_key_that_is_not_the_roles_is_refused(
    scene: Scene, role: str, signed_by: str
) -> None:
    metadata = newest(scene, role)
    signer = scene.signer(OTHER_ROLE[role]) if signed_by == "another role's key" else stranger()
    metadata.sign(signer)  # replaces the genuine signature
    _refused_as_unsigned(scene, role, metadata)


# ------------------------------------------------------ 2. snapshot does not match targets
def _targets_ahead_of_snapshot(scene: Scene) -> tuple[str, Metadata]:
    """Holder of the targets key re-signs targets as v3; the snapshot still records v2."""
    targets = scene.served(SERVED["targets"])
    targets.signed.version = 3
    targets.sign(scene.signer("targets"))
    return SERVED["targets"], targets


def _snapshot_ahead_of_targets(scene: Scene) -> tuple[str, Metadata]:
    """Holder of the snapshot key records targets v3, served as targets v2 was (not re-signed)."""
    snapshot = scene.served(SERVED["snapshot"])
    snapshot.signed.meta["targets.json"] = MetaFile(version=3)
    snapshot.sign(scene.signer("snapshot"))
    tamper(
        scene.lake,
        metadata_key("targets", 3),
        scene.lake.get_object(MAIN_BRANCH, SERVED["targets"]),
    )
    return SERVED["snapshot"], snapshot


def _stale_targets_at_the_recorded_version(scene: Scene) -> tuple[str, Metadata]:
    """No key needed: the older, validly signed targets v1 served where v2 is recorded."""
    return SERVED["targets"], scene.served(metadata_key("targets", 1))


def _snapshot_records_another_hash(scene: Scene) -> tuple[str, Metadata]:
    """The snapshot pins targets v2 by length and hash, but of other bytes (targets v1)."""
    pinned = scene.lake.get_object(MAIN_BRANCH, metadata_key("targets", 1))
    snapshot = scene.served(SERVED["snapshot"])
    snapshot.signed.meta["targets.json"] = MetaFile(
        version=2, length=len(pinned), hashes={"sha256": hashlib.sha256(pinned).hexdigest()}
    )
    snapshot.sign(scene.signer("snapshot"))
    return SERVED["snapshot"], snapshot


@pytest.mark.parametrize(
    ("forge", "match"),
    [
        pytest.param(
            _targets_ahead_of_snapshot,
            "Expected targets v2, got v3",
            id="targets-ahead-of-snapshot",
        ),
        pytest.param(
            _stale_targets_at_the_recorded_version,
            "Expected targets v2, got v1",
            id="stale-targets-at-the-recorded-version",
        ),
    ],
)
def test_targets_that_do_not_match_the_snapshot_are_refused(
    scene: Scene, forge: Callable[[Scene], tuple[str, Metadata]], match: str
) -> None:
    trusted = scene.on_disk()
    key, metadata = forge(scene)
    genuine = scene.lake.get_object(MAIN_BRANCH, key)
    scene.serve(key, metadata)

    reason, _ = refuse(scene, trusted, match=match)

    assert reason is exceptions.BadVersionNumberError
    accepts_genuine(scene, key, genuine)


@pytest.mark.parametrize(
    ("forge", "reason", "match"),
    [
        pytest.param(
            _snapshot_ahead_of_targets,
            exceptions.BadVersionNumberError,
            "Expected targets v3, got v2",
            id="snapshot-ahead-of-targets",
        ),
        pytest.param(
            _snapshot_records_another_hash,
            exceptions.LengthOrHashMismatchError,
            "Observed hash .* does not match expected hash",
            id="snapshot-records-another-hash",
        ),
    ],
)
def test_a_snapshot_that_does_not_match_the_served_targets_is_refused(
    scene: Scene, forge: Callable[[Scene], tuple[str, Metadata]], reason: type, match: str
) -> None:
    """Signed with the snapshot key, the forged snapshot verifies on its own, so tuf stores it
    (as the spec says); the targets it names never verify, so nothing is installed. The car
    holds that snapshot until the repository rotates the leaked key, and then recovers."""
    trusted = scene.on_disk()
    key, metadata = forge(scene)
    forged = scene.serve(key, metadata)

    refused, after = refuse(scene, trusted, match=match)

    assert refused is reason
    assert after["metadata/snapshot.json"] == forged, "validly signed by the snapshot key"
    rotate_keys(scene, "snapshot")


# -------------------------------------------------------------- 3. rollback of targets
def test_a_targets_version_below_the_trusted_one_is_refused(scene: Scene) -> None:
    """The car trusts targets v2 (engine 2). Holders of the online snapshot and timestamp keys
    publish snapshot v3 and timestamp v3, both validly signed, recording the older, validly
    signed targets v1 (engine 1): a downgrade the car must refuse."""
    assert scene.vehicle().update().model_version == "2"
    trusted = scene.on_disk()
    snapshot = scene.served(SERVED["snapshot"])
    snapshot.signed.version = 3
    snapshot.signed.meta["targets.json"] = MetaFile(version=1)
    snapshot.sign(scene.signer("snapshot"))
    forged = scene.serve(metadata_key("snapshot", 3), snapshot)
    timestamp = scene.served(SERVED["timestamp"])
    timestamp.signed.version = 3
    timestamp.signed.snapshot_meta = MetaFile(version=3)
    timestamp.sign(scene.signer("timestamp"))
    scene.serve(SERVED["timestamp"], timestamp)

    reason, after = refuse(scene, trusted, match="targets.json version")

    assert reason is exceptions.BadVersionNumberError
    assert forged not in after.values(), "the downgrading snapshot is never stored"
    assert after["metadata/snapshot.json"] == trusted["metadata/snapshot.json"]
    rotate_keys(scene, "snapshot", "timestamp")
