"""The OTA repository: TUF metadata (root, targets, snapshot, timestamp) on ``main``.

Vehicles trust nothing but a root they were provisioned with. Every engine they may install is
listed in signed ``targets`` metadata with its length and SHA-256, per vehicle model and
engine target, on one of two channels: ``production`` (everyone) and ``candidate`` (only the
rollout cohort, decided on the vehicle from the cohort percent and salt in the target's
``custom`` data). Snapshot and timestamp metadata pin which targets version is current and
expire quickly, so a vehicle rejects a tampered engine, stale metadata and a rollback to an
older version (the ``tuf.ngclient`` client in ``ota_client.py`` does exactly that).

Only certified engines are listed: each one's certificate is verified (signature and every
hash it binds) before it enters the metadata. The repository is consistent-snapshot: every
version of ``targets``/``snapshot``/``root`` stays on ``main`` as ``<version>.<role>.json`` and
engine files as ``<sha256>.<name>``, so a vehicle mid-update still finds what it started on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions as tuf_exceptions
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

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.lake.layout import PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH, publish_objects

from .certificate import CertificateError, sha256_hex, verify_certificate
from .cohorts import CANDIDATE_STATUSES
from .keys import TUF_ROLES, ReleaseKeys

OTA_PREFIX = "ota/"
METADATA_PREFIX = f"{OTA_PREFIX}metadata/"
TARGETS_PREFIX = f"{OTA_PREFIX}targets/"
ROLLOUT_PREFIX = "release/rollout/"
ROLLOUT_CURRENT_KEY = f"{ROLLOUT_PREFIX}current.json"
PRODUCTION_CHANNEL = "production"
CANDIDATE_CHANNEL = "candidate"
HASH_ALGORITHM = "sha256"
_VERSIONED_NAME = re.compile(r"^(\d+)\.(root|targets|snapshot|timestamp)\.json$")


class OtaError(RuntimeError):
    """The OTA repository cannot be published as asked."""


class OtaRefused(OtaError):
    """An engine that should be listed is not (or no longer) certified; nothing was published."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            f"OTA release refused, {len(problems)} engine(s) not certified: " + "; ".join(problems)
        )

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.problems,))


# -------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TufSettings:
    thresholds: dict[str, int]
    expiry: dict[str, timedelta]
    renew_when_remaining: float
    consistent_snapshot: bool


@dataclass(frozen=True)
class OtaSettings:
    engine_filename: str
    vehicle_models: list[str]
    default_targets: list[str]
    targets_by_vehicle_model: dict[str, list[str]]

    def targets_for(self, vehicle_model: str) -> list[str]:
        return self.targets_by_vehicle_model.get(vehicle_model, self.default_targets)


def tuf_settings() -> TufSettings:
    tuf = load_resource_yaml("release.yaml")["tuf"]
    missing = [
        role
        for role in TUF_ROLES
        if role not in tuf["thresholds"] or role not in tuf["expiry_days"]
    ]
    if missing:
        raise OtaError(f"resources/release.yaml tuf: no threshold/expiry for {', '.join(missing)}")
    thresholds = {role: int(tuf["thresholds"][role]) for role in TUF_ROLES}
    if any(value < 1 for value in thresholds.values()):
        raise OtaError(f"resources/release.yaml tuf.thresholds must be >= 1: {thresholds}")
    return TufSettings(
        thresholds=thresholds,
        expiry={role: timedelta(days=float(tuf["expiry_days"][role])) for role in TUF_ROLES},
        renew_when_remaining=float(tuf["renew_when_remaining"]),
        consistent_snapshot=bool(tuf.get("consistent_snapshot", True)),
    )


def ota_settings() -> OtaSettings:
    ota = load_resource_yaml("release.yaml")["ota"]
    fleet = load_resource_yaml("fleet.yaml")["fleet"]
    return OtaSettings(
        engine_filename=str(ota["engine_filename"]),
        vehicle_models=[str(model["name"]) for model in fleet["vehicle_models"]],
        default_targets=[str(t) for t in ota["default_targets"]],
        targets_by_vehicle_model={
            str(model): [str(t) for t in targets]
            for model, targets in (ota.get("targets_by_vehicle_model") or {}).items()
        },
    )


def target_path(vehicle_model: str, engine_target: str, channel: str, filename: str) -> str:
    """The TUF target path of a channel's engine for one vehicle model and engine target."""
    return f"{vehicle_model}/{engine_target}/{channel}/{filename}"


def stored_target_key(path: str, sha256: str) -> str:
    """Where a target file lives in the lake: consistent-snapshot naming ``<hash>.<name>``."""
    directory, _, name = path.rpartition("/")
    return f"{TARGETS_PREFIX}{directory}/{sha256}.{name}"


# ------------------------------------------------------------------------- what to offer
@dataclass(frozen=True)
class EngineOffer:
    """A certified engine offered on a channel (what one TUF target entry describes)."""

    channel: str
    model_version: str
    engine_key: str
    engine_sha256: str
    engine_target: str
    precision: str | None
    certificate_sha256: str
    data: bytes = field(repr=False)
    cohort_percent: float | None = None
    cohort_salt: str | None = None
    rollout_stage: str | None = None

    def custom(self, vehicle_model: str) -> dict[str, Any]:
        custom: dict[str, Any] = {
            "channel": self.channel,
            "model_version": self.model_version,
            "engine_sha256": self.engine_sha256,
            "certificate_sha256": self.certificate_sha256,
            "precision": self.precision,
            "engine_target": self.engine_target,
            "vehicle_model": vehicle_model,
        }
        if self.channel == CANDIDATE_CHANNEL:
            # A decimal string: TUF signs canonical JSON, which has no floating-point numbers.
            custom |= {
                "cohort_percent": repr(float(self.cohort_percent or 0.0)),
                "cohort_salt": self.cohort_salt,
                "rollout_stage": self.rollout_stage,
            }
        return custom


def read_rollout_state(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict[str, Any] | None:
    """The current rollout (``release/rollout/current.json`` → ``<version>.json``), if any."""
    if not lake.object_exists(ref, ROLLOUT_CURRENT_KEY):
        return None
    version = str(lake.get_json(ref, ROLLOUT_CURRENT_KEY)["model_version"])
    key = f"{ROLLOUT_PREFIX}{version}.json"
    if not lake.object_exists(ref, key):
        raise OtaError(f"{ROLLOUT_CURRENT_KEY} names model version {version} but {key} is missing")
    return lake.get_json(ref, key)


def _certified_offer(
    lake: VersionedLake,
    ref: str,
    channel: str,
    model_version: str,
    expected_sha256: str | None,
    public_keys: Ed25519PublicKey | Iterable[Ed25519PublicKey],
    problems: list[str],
    **cohort: Any,
) -> EngineOffer | None:
    try:
        certificate = verify_certificate(lake, model_version, public_keys, ref)
    except CertificateError as error:
        problems.append(f"{channel} model version {model_version}: {error}")
        return None
    engine = certificate["engine"]
    if expected_sha256 and expected_sha256 != engine["sha256"]:
        problems.append(
            f"{channel} model version {model_version}: engine {expected_sha256[:12]} is not the "
            f"certified engine {engine['sha256'][:12]}"
        )
        return None
    return EngineOffer(
        channel=channel,
        model_version=model_version,
        engine_key=engine["key"],
        engine_sha256=engine["sha256"],
        engine_target=str(engine.get("target") or ""),
        precision=engine.get("precision"),
        certificate_sha256=certificate["certificate_sha256"],
        data=lake.get_object(ref, engine["key"]),
        **cohort,
    )


def plan_offers(
    lake: VersionedLake,
    public_keys: Ed25519PublicKey | Iterable[Ed25519PublicKey],
    settings: OtaSettings | None = None,
    ref: str = MAIN_BRANCH,
) -> list[EngineOffer]:
    """The engines to list: production, plus the candidate while its rollout is live.

    Raises ``OtaRefused`` naming every engine whose certificate does not verify (or that is
    not the engine its certificate names); nothing is offered then.
    """
    settings = settings or ota_settings()
    problems: list[str] = []
    offers: list[EngineOffer] = []
    production_version: str | None = None
    if lake.object_exists(ref, PRODUCTION_POINTER_KEY):
        pointer = lake.get_json(ref, PRODUCTION_POINTER_KEY)
        production_version = str(pointer["version"])
        expected = pointer.get("engine_sha256") or sha256_hex(
            lake.get_object(pointer.get("commit") or ref, pointer["onnx_key"])
        )
        offer = _certified_offer(
            lake, ref, PRODUCTION_CHANNEL, production_version, expected, public_keys, problems
        )
        offers += [offer] if offer else []
    state = read_rollout_state(lake, ref)
    if (
        state is not None
        and state.get("status") in CANDIDATE_STATUSES
        and str(state["model_version"]) != production_version
    ):
        offer = _certified_offer(
            lake,
            ref,
            CANDIDATE_CHANNEL,
            str(state["model_version"]),
            state.get("engine_sha256"),
            public_keys,
            problems,
            cohort_percent=float(state["cohort_percent"]),
            cohort_salt=str(state["cohort_salt"]),
            rollout_stage=str(state.get("stage", "")),
        )
        offers += [offer] if offer else []
    if problems:
        raise OtaRefused(problems)
    return offers


def desired_targets(
    offers: list[EngineOffer], settings: OtaSettings
) -> tuple[dict[str, TargetFile], dict[str, EngineOffer], list[str]]:
    """Target entries per vehicle model × engine target × channel, and the uncovered pairs
    (a configured vehicle model/target with no production engine)."""
    targets: dict[str, TargetFile] = {}
    sources: dict[str, EngineOffer] = {}
    uncovered: list[str] = []
    for vehicle_model in settings.vehicle_models:
        for engine_target in settings.targets_for(vehicle_model):
            matching = [offer for offer in offers if offer.engine_target == engine_target]
            if not any(offer.channel == PRODUCTION_CHANNEL for offer in matching):
                uncovered.append(f"{vehicle_model}/{engine_target}")
            for offer in matching:
                path = target_path(
                    vehicle_model, engine_target, offer.channel, settings.engine_filename
                )
                targets[path] = TargetFile(
                    length=len(offer.data),
                    hashes={HASH_ALGORITHM: offer.engine_sha256},
                    path=path,
                    unrecognized_fields={"custom": offer.custom(vehicle_model)},
                )
                sources[path] = offer
    return targets, sources, uncovered


# ---------------------------------------------------------------------- repository state
@dataclass
class RepositoryState:
    """The newest version of each role on ``main`` (None before the first publication)."""

    root: Metadata[Root] | None = None
    targets: Metadata[Targets] | None = None
    snapshot: Metadata[Snapshot] | None = None
    timestamp: Metadata[Timestamp] | None = None

    def version(self, role: str) -> int:
        metadata = getattr(self, role)
        return metadata.signed.version if metadata is not None else 0


def metadata_key(role: str, version: int | None = None) -> str:
    return (
        f"{METADATA_PREFIX}{role}.json"
        if version is None
        else (f"{METADATA_PREFIX}{version}.{role}.json")
    )


def load_repository(lake: VersionedLake, ref: str = MAIN_BRANCH) -> RepositoryState:
    """The newest stored version of every role, each verified against the newest root.

    Versions come from the stored history (``<version>.<role>.json``), not from a mutable
    pointer, so an older file copied over ``timestamp.json`` can never make the repository
    issue a lower version than it already has.
    """
    newest: dict[str, int] = {}
    for stat in lake.list_objects(ref, METADATA_PREFIX):
        match = _VERSIONED_NAME.match(stat.key[len(METADATA_PREFIX) :])
        if match:
            role = match.group(2)
            newest[role] = max(newest.get(role, 0), int(match.group(1)))
    state = RepositoryState()
    if not newest:
        return state
    if "root" not in newest:
        raise OtaError(f"{METADATA_PREFIX} holds role metadata but no root: repository is corrupt")
    for role, version in newest.items():
        setattr(state, role, Metadata.from_bytes(lake.get_object(ref, metadata_key(role, version))))
    try:
        for role in TUF_ROLES:
            metadata = getattr(state, role)
            if metadata is not None:
                state.root.signed.verify_delegate(role, metadata.signed_bytes, metadata.signatures)
    except tuf_exceptions.UnsignedMetadataError as error:
        raise OtaError(
            f"stored OTA metadata does not verify against root v{state.root.signed.version}: "
            f"{error}; refusing to build on it"
        ) from error
    return state


def root_metadata(lake: VersionedLake, version: int | None = None, ref: str = MAIN_BRANCH) -> bytes:
    """Root metadata bytes (newest, or ``version``): what a vehicle is provisioned to trust."""
    key = metadata_key(Root.type, version)
    if not lake.object_exists(ref, key):
        raise OtaError(f"no OTA root metadata at {key} on {ref}: run ota_release first")
    return lake.get_object(ref, key)


# ------------------------------------------------------------------------------- publishing
@dataclass(frozen=True)
class OtaPublication:
    versions: dict[str, int]
    resigned: list[str]
    targets: dict[str, dict[str, Any]]
    uncovered: list[str]
    commit: str


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


def publish_ota_repository(
    lake: VersionedLake,
    keys: ReleaseKeys,
    offers: list[EngineOffer],
    *,
    root_run_id: str,
    now: datetime | None = None,
    tuf: TufSettings | None = None,
    settings: OtaSettings | None = None,
) -> OtaPublication:
    """Sign the next repository version for ``offers`` and publish it to ``main`` in one merge.

    A role gets a new version when its content changes, when its keys or threshold changed,
    or when its renewal is due; the timestamp gets one on every call (that is what keeps
    vehicles' view fresh). Versions continue from the newest stored one, so they only grow.
    """
    tuf = tuf or tuf_settings()
    settings = settings or ota_settings()
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    current = load_repository(lake)
    signers = {
        role: [CryptoSigner(key) for key in keys.tuf_signers(role, tuf.thresholds[role])]
        for role in TUF_ROLES
    }
    objects: dict[str, bytes] = {}
    resigned: list[str] = []

    def due(role: str) -> bool:
        metadata = getattr(current, role)
        return metadata is None or _renewal_due(
            metadata.signed, tuf.expiry[role], tuf.renew_when_remaining, now
        )

    root = current.root
    if root is None or due("root") or _role_keys_differ(root.signed, signers, tuf):
        root = _new_root(current.root, signers, tuf, now)
        data = _serialize(root)
        objects[metadata_key("root", root.signed.version)] = data
        objects[metadata_key("root")] = data
        resigned.append("root")

    wanted, sources, uncovered = desired_targets(offers, settings)
    targets = current.targets
    if targets is None or "root" in resigned or due("targets") or targets.signed.targets != wanted:
        targets = _sign(
            Targets(
                version=current.version("targets") + 1,
                expires=now + tuf.expiry["targets"],
                targets=wanted,
            ),
            signers["targets"],
        )
        objects[metadata_key("targets", targets.signed.version)] = _serialize(targets)
        resigned.append("targets")
        for path, offer in sources.items():
            key = stored_target_key(path, offer.engine_sha256)
            if not lake.object_exists(MAIN_BRANCH, key):
                objects[key] = offer.data

    snapshot = current.snapshot
    if "targets" in resigned or due("snapshot"):
        snapshot = _sign(
            Snapshot(
                version=current.version("snapshot") + 1,
                expires=now + tuf.expiry["snapshot"],
                meta={"targets.json": MetaFile(version=targets.signed.version)},
            ),
            signers["snapshot"],
        )
        objects[metadata_key("snapshot", snapshot.signed.version)] = _serialize(snapshot)
        resigned.append("snapshot")

    timestamp = _sign(
        Timestamp(
            version=current.version("timestamp") + 1,
            expires=now + tuf.expiry["timestamp"],
            snapshot_meta=MetaFile(version=snapshot.signed.version),
        ),
        signers["timestamp"],
    )
    timestamp_bytes = _serialize(timestamp)
    objects[metadata_key("timestamp", timestamp.signed.version)] = timestamp_bytes
    objects[metadata_key("timestamp")] = timestamp_bytes
    resigned.append("timestamp")

    versions = {
        "root": root.signed.version,
        "targets": targets.signed.version,
        "snapshot": snapshot.signed.version,
        "timestamp": timestamp.signed.version,
    }
    commit = publish_objects(
        lake,
        root_run_id,
        objects,
        f"OTA repository: targets v{versions['targets']}, timestamp v{versions['timestamp']}",
        {"kind": "ota", **{f"{role}_version": str(v) for role, v in versions.items()}},
    )
    listed = {path: dict(target.custom) for path, target in targets.signed.targets.items()}
    return OtaPublication(versions, resigned, listed, uncovered, commit)
