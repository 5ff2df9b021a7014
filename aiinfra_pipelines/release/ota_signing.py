"""Signing and publishing the OTA repository's next version (TUF roles on ``main``).

Split from ``ota.py`` (what to offer, and reading the stored repository) because signing is
its own job with its own rules: versions only grow from the verified current ones, a role is
re-signed only when its content, keys or threshold changed or its renewal is due, a new root
must also satisfy the previous root's keys, the timestamp is re-signed on every call to keep
vehicles' view fresh, snapshot and timestamp pin the length and SHA-256 of the file they name,
and a published ``<n>.<role>.json`` is never overwritten.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Signed,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects

from .keys import TUF_ROLES, ReleaseKeys
from .ota import (
    HASH_ALGORITHM,
    EngineOffer,
    OtaError,
    OtaSettings,
    RepositoryState,
    TufSettings,
    desired_targets,
    load_repository,
    metadata_key,
    stored_target_key,
)

# A published, versioned metadata file (the unversioned root.json / timestamp.json are the
# pointers vehicles fetch first, replaced on purpose).
_VERSIONED_METADATA = re.compile(r"^.*/\d+\.(root|targets|snapshot|timestamp)\.json$")

# Targets that are not engines: trigger configs (``release.trigger_ota``), one per vehicle
# model under this folder. A publication that does not name them keeps the listed ones.
TRIGGER_TARGETS_DIR = "triggers/"


def trigger_target_path(vehicle_model: str, filename: str = "trigger-config.json") -> str:
    """The TUF target path of a vehicle model's trigger config."""
    return f"{TRIGGER_TARGETS_DIR}{vehicle_model}/{filename}"


@dataclass(frozen=True)
class OtaFile:
    """A non-engine target file (a trigger config): its path, bytes and signed custom data."""

    path: str
    data: bytes = field(repr=False)
    custom: dict[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def target(self) -> TargetFile:
        return TargetFile(
            length=len(self.data),
            hashes={HASH_ALGORITHM: self.sha256},
            path=self.path,
            unrecognized_fields={"custom": self.custom},
        )


@dataclass(frozen=True)
class OtaPublication:
    versions: dict[str, int]
    resigned: list[str]
    targets: dict[str, dict[str, Any]]
    uncovered: list[str]
    commit: str
    trigger_targets: dict[str, dict[str, Any]] = field(default_factory=dict)


def _renewal_due(signed: Signed, period: timedelta, fraction: float, now: datetime) -> bool:
    return signed.expires - now < period * fraction


def _role_keys_differ(root: Root, signers: dict[str, list[CryptoSigner]], tuf: TufSettings) -> bool:
    for role in TUF_ROLES:
        wanted = sorted(signer.public_key.keyid for signer in signers[role])
        if (
            sorted(root.roles[role].keyids) != wanted
            or root.roles[role].threshold != (tuf.thresholds[role])
        ):
            return True
    return False


def _sign(signed: Signed, signers: list[CryptoSigner]) -> Metadata:
    metadata = Metadata(signed)
    for signer in signers:
        metadata.sign(signer, append=True)
    return metadata


def _serialize(metadata: Metadata) -> bytes:
    return metadata.to_bytes(JSONSerializer(compact=False))


def _new_root(
    current: Metadata[Root] | None,
    signers: dict[str, list[CryptoSigner]],
    tuf: TufSettings,
    now: datetime,
) -> Metadata[Root]:
    root = Root(
        version=(current.signed.version + 1) if current else 1,
        expires=now + tuf.expiry["root"],
        consistent_snapshot=tuf.consistent_snapshot,
    )
    for role in TUF_ROLES:
        for signer in signers[role]:
            root.add_key(signer.public_key, role)
        root.roles[role].threshold = tuf.thresholds[role]
    if current is not None:
        # Vehicles accept root N+1 only if root N's own keys sign it (threshold of them).
        previous = current.signed.roles[Root.type]
        available = {signer.public_key.keyid for signer in signers["root"]}
        if len(available & set(previous.keyids)) < previous.threshold:
            raise OtaError(
                f"the root keys changed: root v{root.version} must also be signed by "
                f"{previous.threshold} key(s) of root v{current.signed.version}, which are not "
                "configured; sign the new root with the previous root keys offline"
            )
    return _sign(root, signers["root"])


@dataclass
class _Signing:
    """One publication's signing session: the stored repository, this run's signers, and the
    metadata files signed so far (``objects``), in the order the roles were re-signed."""

    current: RepositoryState
    signers: dict[str, list[CryptoSigner]]
    tuf: TufSettings
    now: datetime
    objects: dict[str, bytes] = field(default_factory=dict)
    resigned: list[str] = field(default_factory=list)

    def due(self, role: str) -> bool:
        """Whether ``role`` must be re-signed for freshness (missing, or renewal is due)."""
        metadata = getattr(self.current, role)
        return metadata is None or _renewal_due(
            metadata.signed, self.tuf.expiry[role], self.tuf.renew_when_remaining, self.now
        )

    def store(self, role: str, metadata: Metadata, *, also_unversioned: bool = False) -> None:
        """Keep ``<version>.<role>.json`` (and ``<role>.json`` for the entry points a vehicle
        fetches without knowing the version: root and timestamp)."""
        data = _serialize(metadata)
        self.objects[metadata_key(role, metadata.signed.version)] = data
        if also_unversioned:
            self.objects[metadata_key(role)] = data
        self.resigned.append(role)


def _next_root(signing: _Signing) -> Metadata[Root]:
    """A new root when there is none, it is due, or its keys/thresholds changed."""
    root = signing.current.root
    if (
        root is None
        or signing.due("root")
        or _role_keys_differ(root.signed, signing.signers, signing.tuf)
    ):
        root = _new_root(signing.current.root, signing.signers, signing.tuf, signing.now)
        signing.store("root", root, also_unversioned=True)
    return root


def _carried_trigger_targets(current: RepositoryState) -> dict[str, TargetFile]:
    """The trigger-config targets the stored repository lists (kept by engine publications)."""
    if current.targets is None:
        return {}
    return {
        path: target
        for path, target in current.targets.signed.targets.items()
        if path.startswith(TRIGGER_TARGETS_DIR)
    }


def _next_targets(
    lake: VersionedLake,
    signing: _Signing,
    wanted: dict[str, TargetFile],
    sources: dict[str, tuple[str, bytes]],
) -> Metadata[Targets]:
    """New targets when root changed, renewal is due or the listed engines changed; the
    engine files it lists are stored (content-addressed) with it."""
    targets = signing.current.targets
    if (
        targets is None
        or "root" in signing.resigned
        or signing.due("targets")
        or targets.signed.targets != wanted
    ):
        targets = _sign(
            Targets(
                version=signing.current.version("targets") + 1,
                expires=signing.now + signing.tuf.expiry["targets"],
                targets=wanted,
            ),
            signing.signers["targets"],
        )
        signing.store("targets", targets)
        for path, (sha256, data) in sources.items():
            key = stored_target_key(path, sha256)
            if not lake.object_exists(MAIN_BRANCH, key):
                signing.objects[key] = data
    return targets


def _pinned(signing: _Signing, role: str, metadata: Metadata) -> MetaFile:
    """The entry that pins ``metadata``: its version, and the length and SHA-256 of its bytes
    as stored (signed in this run, or as the verified repository holds them)."""
    version = metadata.signed.version
    data = signing.objects.get(metadata_key(role, version)) or signing.current.raw[role]
    return MetaFile.from_data(version, data, [HASH_ALGORITHM])


def _next_snapshot(signing: _Signing, targets: Metadata[Targets]) -> Metadata[Snapshot]:
    """A new snapshot whenever targets changed, its renewal is due, or the one stored does
    not pin the current targets by length and hash (a repository from before it did)."""
    snapshot = signing.current.snapshot
    entry = _pinned(signing, "targets", targets)
    if (
        snapshot is None
        or "targets" in signing.resigned
        or signing.due("snapshot")
        or snapshot.signed.meta.get("targets.json") != entry
    ):
        snapshot = _sign(
            Snapshot(
                version=signing.current.version("snapshot") + 1,
                expires=signing.now + signing.tuf.expiry["snapshot"],
                meta={"targets.json": entry},
            ),
            signing.signers["snapshot"],
        )
        signing.store("snapshot", snapshot)
    return snapshot


def _next_timestamp(signing: _Signing, snapshot: Metadata[Snapshot]) -> Metadata[Timestamp]:
    """Always a new timestamp: that is what keeps vehicles' view of the repository fresh."""
    timestamp = _sign(
        Timestamp(
            version=signing.current.version("timestamp") + 1,
            expires=signing.now + signing.tuf.expiry["timestamp"],
            snapshot_meta=_pinned(signing, "snapshot", snapshot),
        ),
        signing.signers["timestamp"],
    )
    signing.store("timestamp", timestamp, also_unversioned=True)
    return timestamp


def refuse_overwrites(lake: VersionedLake, objects: dict[str, bytes]) -> None:
    """Refuse to publish a ``<n>.<role>.json`` that ``main`` already holds with other bytes: a
    published version is immutable (vehicles may have verified it), so two different documents
    must never carry one version. The same bytes again (a retried publication) are fine."""
    for key, data in objects.items():
        published = _VERSIONED_METADATA.match(key) and lake.object_exists(MAIN_BRANCH, key)
        if published and lake.get_object(MAIN_BRANCH, key) != data:
            raise OtaError(
                f"{key} already exists on {MAIN_BRANCH} with other content: refusing to "
                "overwrite a published version (a file planted at the next version "
                "stops publishing until it is removed)"
            )


def publish_ota_repository(
    lake: VersionedLake,
    keys: ReleaseKeys,
    offers: list[EngineOffer],
    *,
    root_run_id: str,
    now: datetime | None = None,
    tuf: TufSettings | None = None,
    settings: OtaSettings | None = None,
    trigger_files: Sequence[OtaFile] | None = None,
) -> OtaPublication:
    """Sign the next repository version for ``offers`` and publish it to ``main`` in one merge.

    ``trigger_files`` replace the listed trigger-config targets (``[]`` withdraws them);
    ``None`` keeps whatever the stored targets list, so an engine release never drops them.

    A role gets a new version when its content changes, when its keys or threshold changed,
    or when its renewal is due; the timestamp gets one on every call (that is what keeps
    vehicles' view fresh). Versions continue from the current verified ones
    (``load_repository``: signed content, never file names), so they only grow, and no
    published version is ever overwritten (``refuse_overwrites``).
    """
    tuf = tuf or TufSettings.load()
    settings = settings or OtaSettings.load()
    signing = _Signing(
        current=load_repository(lake),
        signers={
            role: [CryptoSigner(key) for key in keys.tuf_signers(role, tuf.thresholds[role])]
            for role in TUF_ROLES
        },
        tuf=tuf,
        now=(now or datetime.now(UTC)).replace(microsecond=0),
    )
    wanted, offered, uncovered = desired_targets(offers, settings)
    sources = {path: (offer.engine_sha256, offer.data) for path, offer in offered.items()}
    if trigger_files is None:
        wanted |= _carried_trigger_targets(signing.current)
    else:
        wanted |= {file.path: file.target() for file in trigger_files}
        sources |= {file.path: (file.sha256, file.data) for file in trigger_files}
    root = _next_root(signing)
    targets = _next_targets(lake, signing, wanted, sources)
    snapshot = _next_snapshot(signing, targets)
    timestamp = _next_timestamp(signing, snapshot)
    versions = {
        "root": root.signed.version,
        "targets": targets.signed.version,
        "snapshot": snapshot.signed.version,
        "timestamp": timestamp.signed.version,
    }
    refuse_overwrites(lake, signing.objects)
    commit = publish_objects(
        lake,
        root_run_id,
        signing.objects,
        f"OTA repository: targets v{versions['targets']}, timestamp v{versions['timestamp']}",
        {"kind": "ota", **{f"{role}_version": str(v) for role, v in versions.items()}},
    )
    listed = {path: dict(target.custom) for path, target in targets.signed.targets.items()}
    engines = {p: c for p, c in listed.items() if not p.startswith(TRIGGER_TARGETS_DIR)}
    configs = {p: c for p, c in listed.items() if p.startswith(TRIGGER_TARGETS_DIR)}
    return OtaPublication(versions, signing.resigned, engines, uncovered, commit, configs)
