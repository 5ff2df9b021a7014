"""TUF metadata tampering: a vehicle refuses bad signatures, metadata whose bytes are not the
ones its parent pins, a snapshot that does not match targets and a rollback of targets, and
keeps what it already trusted; files planted in the repository folder never steer the signer.

One repository is built once by our own release code (certify, production pointer,
``publish_ota_repository``): engine 1 is published (every role v1), a car updates and trusts
it, then engine 2 is published (targets, snapshot and timestamp v2). Each test copies that lake
and the car's TUF cache, forges one metadata file with python-tuf's ``Metadata`` API the way an
attacker with write access to the lake (and, where a test says so, some of the repository's
keys) would, and updates the car through the real ``VehicleUpdater``: it must refuse with
``OtaVerificationError`` (tuf's reason attached), install nothing and keep its targets
metadata. Then it must recover: with the genuine files put back and the repository's next
timestamp or, where the forgery was signed with a leaked role key (so tuf stored it), once the
repository rotates that key. Snapshot and timestamp pin the length and SHA-256 of the file they
name, so a forgery that is to reach a later check re-pins its parents with their keys
(``repin``: an attacker holding those keys); one that does not is refused on the hash. A control
test shows the same forgeries are accepted when the role's key signs the final body, so
refusals come from what each test breaks. Expiry, a tampered engine file and a rollback of the whole
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
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, OTA_METADATA_PREFIX
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.release.keys import ReleaseKeys, private_key_pem
from aiinfra_pipelines.release.ota import OtaError, load_repository, metadata_key, plan_offers
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
# The role whose metadata pins each role's file by version, length and SHA-256.
PARENT = {"targets": "snapshot", "snapshot": "timestamp"}


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

    def genuine(self) -> dict[str, bytes | None]:
        """What the repository serves for every role now (None: no such file)."""
        return {
            key: self.lake.get_object(MAIN_BRANCH, key)
            if self.lake.object_exists(MAIN_BRANCH, key)
            else None
            for key in SERVED.values()
        }

    def restore(self, genuine: dict[str, bytes | None]) -> None:
        """Put back every served file that a forgery changed (and remove planted ones)."""
        for key, data in genuine.items():
            if data is None and self.lake.object_exists(MAIN_BRANCH, key):
                self.lake.delete_object(MAIN_BRANCH, key)
                self.lake.commit(MAIN_BRANCH, f"remove forged {key}")
            elif data is not None and self.lake.get_object(MAIN_BRANCH, key) != data:
                tamper(self.lake, key, data)

    def refresh(self):
        """The repository's next publication of what it offers now (a new timestamp at least)."""
        offers = plan_offers(self.lake, self.keys.certificate_public_key())
        return publish_ota_repository(self.lake, self.keys, offers, root_run_id="ota-refresh")

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


def repin(scene: Scene, role: str, data: bytes, version: int | None = None) -> None:
    """What a holder of the parent roles' keys does after forging ``role``'s file: the parent
    pins ``data``'s length and SHA-256 (at ``version``, or the version it already records),
    re-signed with the parent's own key, and so on up to the timestamp."""
    parent = PARENT.get(role)
    if parent is None:
        return
    metadata = scene.served(SERVED[parent])
    recorded = (
        metadata.signed.meta[f"{role}.json"]
        if parent == "snapshot"
        else metadata.signed.snapshot_meta
    )
    pinned = MetaFile.from_data(version or recorded.version, data, ["sha256"])
    if parent == "snapshot":
        metadata.signed.meta[f"{role}.json"] = pinned
    else:
        metadata.signed.snapshot_meta = pinned
    metadata.sign(scene.signer(parent))
    repin(scene, parent, scene.serve(SERVED[parent], metadata))


def forge(scene: Scene, role: str, metadata: Metadata) -> bytes:
    """Serve forged ``metadata`` where the car fetches ``role``, its parents re-pinned to it."""
    forged = scene.serve(SERVED[role], metadata)
    repin(scene, role, forged)
    return forged


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


def accepts_genuine(scene: Scene, genuine: dict[str, bytes | None]) -> None:
    """Control: with the genuine files back and the repository's next timestamp (it signs one
    on every publication; a timestamp the car already stored at the same version is not
    fetched again) the same car (same cache) updates to engine 2."""
    scene.restore(genuine)
    assert scene.refresh().resigned == ["timestamp"]
    assert scene.vehicle().update().model_version == "2"


def recovers(scene: Scene, role: str, genuine: dict[str, bytes | None]) -> None:
    """After a forgery of ``role`` re-pinned by its parents: where that took the snapshot key
    (a forged ``targets``), tuf stored the validly signed snapshot, so the car recovers once
    the leaked online keys are rotated; otherwise the genuine files and the next timestamp do."""
    if PARENT.get(role) == "snapshot":
        scene.restore(genuine)
        rotate_keys(scene, "snapshot", "timestamp")
    else:
        accepts_genuine(scene, genuine)


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
    """Control for the tests below: the forging itself (load, change, sign, serve, re-pin the
    parents) yields metadata the car accepts when the role's key signs the final body, so their
    refusals come from the signatures alone."""
    metadata = newest(scene, role)
    _extend_expiry(metadata.signed)
    metadata.sign(scene.signer(role))
    forged = forge(scene, role, metadata)

    assert scene.vehicle().update().model_version == "2"
    stored = "metadata/root_history/2.root.json" if role == "root" else f"metadata/{role}.json"
    assert scene.on_disk()[stored] == forged


def _refused_as_unsigned(scene: Scene, role: str, metadata: Metadata) -> None:
    """Serve forged ``metadata`` for ``role``: the car refuses it as unsigned, stores none of
    it, keeps the role's trusted file, and accepts the genuine file once it is back."""
    trusted = scene.on_disk()
    genuine = scene.genuine()
    forged = forge(scene, role, metadata)

    reason, after = refuse(scene, trusted, match=f"{role} was signed by 0/1 keys")

    assert reason is exceptions.UnsignedMetadataError
    assert forged not in after.values(), "the forged metadata is never stored"
    assert after[f"metadata/{role}.json"] == trusted[f"metadata/{role}.json"]
    recovers(scene, role, genuine)


@pytest.mark.parametrize("role", ["snapshot", "targets"])
def test_metadata_its_parent_does_not_pin_is_refused_on_the_hash(scene: Scene, role: str) -> None:
    """Validly signed by the role's own key, but the parent (not re-signed: its key is not
    held) pins other bytes: refused on length or hash before its signature is even read."""
    trusted = scene.on_disk()
    genuine = scene.genuine()
    metadata = newest(scene, role)
    _extend_expiry(metadata.signed)
    metadata.sign(scene.signer(role))
    forged = scene.serve(SERVED[role], metadata)

    reason, after = refuse(scene, trusted, match="does not match expected")

    assert reason is exceptions.LengthOrHashMismatchError
    assert forged not in after.values()
    accepts_genuine(scene, genuine)


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
def _targets_ahead_of_snapshot(scene: Scene) -> None:
    """Holder of the targets key re-signs targets as v3; the snapshot, re-pinned to its bytes,
    still records v2."""
    targets = scene.served(SERVED["targets"])
    targets.signed.version = 3
    targets.sign(scene.signer("targets"))
    forge(scene, "targets", targets)


def _snapshot_ahead_of_targets(scene: Scene) -> bytes:
    """Holders of the online keys record targets v3 (the genuine v2 bytes, not re-signed,
    copied to where v3 is fetched) in the snapshot and re-pin the timestamp to it."""
    genuine_targets = scene.lake.get_object(MAIN_BRANCH, SERVED["targets"])
    tamper(scene.lake, metadata_key("targets", 3), genuine_targets)
    snapshot = scene.served(SERVED["snapshot"])
    snapshot.signed.meta["targets.json"] = MetaFile.from_data(3, genuine_targets, ["sha256"])
    snapshot.sign(scene.signer("snapshot"))
    return forge(scene, "snapshot", snapshot)


def _stale_targets_at_the_recorded_version(scene: Scene) -> None:
    """Holders of the online keys serve the older, validly signed targets v1 where v2 is
    recorded, the snapshot re-pinned to its bytes."""
    forge(scene, "targets", scene.served(metadata_key("targets", 1)))


def _snapshot_records_another_hash(scene: Scene) -> bytes:
    """The snapshot pins targets v2 by length and hash, but of other bytes (targets v1); the
    timestamp is re-pinned to that snapshot."""
    pinned = scene.lake.get_object(MAIN_BRANCH, metadata_key("targets", 1))
    snapshot = scene.served(SERVED["snapshot"])
    snapshot.signed.meta["targets.json"] = MetaFile.from_data(2, pinned, ["sha256"])
    snapshot.sign(scene.signer("snapshot"))
    return forge(scene, "snapshot", snapshot)


def test_stale_targets_its_snapshot_does_not_pin_are_refused_on_the_hash(scene: Scene) -> None:
    """No key needed: the older, validly signed targets v1 served where v2 is recorded. The
    snapshot pins v2's bytes, so the car refuses on the hash."""
    trusted = scene.on_disk()
    genuine = scene.genuine()
    scene.serve(SERVED["targets"], scene.served(metadata_key("targets", 1)))

    reason, _ = refuse(scene, trusted, match="does not match expected")

    assert reason is exceptions.LengthOrHashMismatchError
    accepts_genuine(scene, genuine)


@pytest.mark.parametrize(
    ("forgery", "match"),
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
    scene: Scene, forgery: Callable[[Scene], None], match: str
) -> None:
    trusted = scene.on_disk()
    genuine = scene.genuine()
    forgery(scene)

    reason, _ = refuse(scene, trusted, match=match)

    assert reason is exceptions.BadVersionNumberError
    recovers(scene, "targets", genuine)


@pytest.mark.parametrize(
    ("forgery", "reason", "match"),
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
    scene: Scene, forgery: Callable[[Scene], bytes], reason: type, match: str
) -> None:
    """Signed with the snapshot key and pinned by a timestamp signed with its key, the forged
    snapshot verifies on its own, so tuf stores it (as the spec says); the targets it names
    never verify, so nothing is installed. The car holds that snapshot until the repository
    rotates the leaked online keys, and then recovers."""
    trusted = scene.on_disk()
    genuine = scene.genuine() | {metadata_key("targets", 3): None}
    forged = forgery(scene)

    refused, after = refuse(scene, trusted, match=match)

    assert refused is reason
    assert after["metadata/snapshot.json"] == forged, "validly signed by the snapshot key"
    scene.restore(genuine)  # operators remove what was planted, then rotate
    rotate_keys(scene, "snapshot", "timestamp")


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
    timestamp.signed.snapshot_meta = MetaFile.from_data(3, forged, ["sha256"])
    timestamp.sign(scene.signer("timestamp"))
    scene.serve(SERVED["timestamp"], timestamp)

    reason, after = refuse(scene, trusted, match="targets.json version")

    assert reason is exceptions.BadVersionNumberError
    assert forged not in after.values(), "the downgrading snapshot is never stored"
    assert after["metadata/snapshot.json"] == trusted["metadata/snapshot.json"]
    rotate_keys(scene, "snapshot", "timestamp")


# ------------------------------------------------- 4. files planted in the repository folder
def _listing(lake: LocalLake) -> dict[str, bytes]:
    return {
        stat.key: lake.get_object(MAIN_BRANCH, stat.key)
        for stat in lake.list_objects(MAIN_BRANCH, OTA_METADATA_PREFIX)
    }


def _plant_high_versions(scene: Scene) -> None:
    """Write access to the lake, no key: every role's v1 copied to ``99.<role>.json``, and
    targets v2 re-numbered 50 and signed by a stranger."""
    for role in ROLES:
        tamper(
            scene.lake,
            metadata_key(role, 99),
            scene.lake.get_object(MAIN_BRANCH, metadata_key(role, 1)),
        )
    forged = scene.served(metadata_key("targets", 2))
    forged.signed.version = 50
    forged.sign(stranger())
    scene.serve(metadata_key("targets", 50), forged)


def test_planted_copies_do_not_steer_the_next_signature(scene: Scene, tmp_path: Path) -> None:
    """Versions and content come from verified metadata only: the planted files are listed as
    ignored, the next publication continues from the genuine versions (timestamp v3 pinning
    snapshot v2 by hash), overwrites nothing published, and new and existing cars update."""
    _plant_high_versions(scene)
    before = _listing(scene.lake)
    state = load_repository(scene.lake)
    assert {role: state.version(role) for role in ROLES} == {
        "root": 1,
        "timestamp": 2,
        "snapshot": 2,
        "targets": 2,
    }
    assert sorted(entry.split(":")[0] for entry in state.ignored) == sorted(
        metadata_key(role, version)
        for role, version in [("timestamp", 99), ("snapshot", 99), ("targets", 99), ("targets", 50)]
    )

    publication = scene.refresh()

    assert publication.versions == {"root": 1, "targets": 2, "snapshot": 2, "timestamp": 3}
    assert publication.resigned == ["timestamp"]
    timestamp = scene.served(metadata_key("timestamp"))
    timestamp.signed.snapshot_meta.verify_length_and_hashes(
        scene.lake.get_object(MAIN_BRANCH, metadata_key("snapshot", 2))
    )
    after = _listing(scene.lake)
    assert {k: v for k, v in after.items() if k in before and k != metadata_key("timestamp")} == {
        k: v for k, v in before.items() if k != metadata_key("timestamp")
    }, "nothing published is rewritten"
    assert scene.vehicle().update().model_version == "2"
    assert updater(scene.lake, scene.car, tmp_path / "new-car").update().model_version == "2"
    release_engine(scene.lake, scene.keys, "3", seed=3)
    assert scene.vehicle().update().model_version == "3"
    assert updater(scene.lake, scene.car, tmp_path / "new-car").update().model_version == "3"


def test_a_planted_root_in_the_chain_stops_the_signer_with_a_clear_error(scene: Scene) -> None:
    """``2.root.json`` is the next root a vehicle walks to: one not signed by root v1's keys
    stops vehicles too, so the signer refuses to build on it and says which file it is."""
    root = newest(scene, "root")
    root.sign(stranger())
    scene.serve(metadata_key("root", 2), root)
    before = _listing(scene.lake)

    with pytest.raises(OtaError, match=r"2\.root\.json is not signed by root v1's keys"):
        scene.refresh()

    assert _listing(scene.lake) == before


@pytest.mark.parametrize("role", ["timestamp", "snapshot", "targets"])
def test_a_file_planted_at_the_next_version_is_refused_not_overwritten(
    scene: Scene, role: str
) -> None:
    """A published version is immutable: a file already at the version the signer is about to
    write stops the publication (and names it); nothing on ``main`` changes, and the car keeps
    updating to what it trusts."""
    tamper(
        scene.lake, metadata_key(role, 3), scene.lake.get_object(MAIN_BRANCH, metadata_key(role, 1))
    )
    before = _listing(scene.lake)

    with pytest.raises(OtaError, match=rf"3\.{role}\.json already exists .* refusing to overwrite"):
        if role == "timestamp":
            scene.refresh()
        else:
            release_engine(scene.lake, scene.keys, "3", seed=3)

    assert _listing(scene.lake) == before
    assert scene.vehicle().update().model_version == "2"


def test_metadata_that_is_not_json_is_ignored_with_its_reason(scene: Scene) -> None:
    tamper(scene.lake, metadata_key("snapshot", 7), b"\x00not json")
    state = load_repository(scene.lake)
    assert state.version("snapshot") == 2
    assert len(state.ignored) == 1
    assert state.ignored[0].startswith(f"{metadata_key('snapshot', 7)}: not TUF metadata")
