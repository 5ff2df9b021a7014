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
What the repository holds now is read from verified, signed metadata only (never from file
names: a planted copy cannot steer the next signature), a published ``<n>.<role>.json`` is
never overwritten, and snapshot and timestamp pin the length and SHA-256 of the files they name.

This module decides what to offer and reads the stored repository; signing and publishing
the next version is ``ota_signing.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import (
    Metadata,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.lake.layout import (
    CURRENT_ROLLOUT_KEY,
    MAIN_BRANCH,
    OTA_METADATA_PREFIX,
    OTA_TARGETS_PREFIX,
    PRODUCTION_POINTER_KEY,
    rollout_state_key,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .certificate import CertificateError, verify_certificate
from .certificate_evidence import sha256_hex
from .cohorts import CANDIDATE_STATUSES
from .keys import TUF_ROLES
from .rollout_state import RolloutState
from .rollout_store import current_version, read_state

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
    """``release.yaml`` ``tuf``: signing thresholds and metadata expiry per TUF role."""

    thresholds: dict[str, int]
    expiry: dict[str, timedelta]
    renew_when_remaining: float
    consistent_snapshot: bool

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> TufSettings:
        """From ``release.yaml`` (or ``config``, the whole file); every role needs both values."""
        tuf = settings_section("release.yaml", "tuf", config)
        thresholds, expiry_days = tuf.section("thresholds"), tuf.section("expiry_days")
        missing = [role for role in TUF_ROLES if role not in thresholds or role not in expiry_days]
        if missing:
            raise OtaError(
                f"resources/release.yaml tuf: no threshold/expiry for {', '.join(missing)}"
            )
        by_role = {role: thresholds.int(role) for role in TUF_ROLES}
        if any(value < 1 for value in by_role.values()):
            raise OtaError(f"resources/release.yaml tuf.thresholds must be >= 1: {by_role}")
        return cls(
            thresholds=by_role,
            expiry={role: timedelta(days=expiry_days.float(role)) for role in TUF_ROLES},
            renew_when_remaining=tuf.float("renew_when_remaining"),
            consistent_snapshot=tuf.bool("consistent_snapshot", True),
        )


@dataclass(frozen=True)
class OtaSettings:
    """``release.yaml`` ``ota`` and the fleet's vehicle models (``fleet.yaml``)."""

    engine_filename: str
    vehicle_models: list[str]
    default_targets: list[str]
    targets_by_vehicle_model: dict[str, list[str]]
    timestamp_refresh_cron: str = ""

    def targets_for(self, vehicle_model: str) -> list[str]:
        return self.targets_by_vehicle_model.get(vehicle_model, self.default_targets)

    @classmethod
    def load(
        cls, config: Mapping[str, Any] | None = None, fleet: Mapping[str, Any] | None = None
    ) -> OtaSettings:
        """From ``release.yaml`` and ``fleet.yaml`` (or ``config``/``fleet``, whole files)."""
        ota = settings_section("release.yaml", "ota", config)
        models = settings_section("fleet.yaml", "fleet", fleet).sections("vehicle_models")
        by_model = ota.section("targets_by_vehicle_model", {})
        return cls(
            engine_filename=ota.str("engine_filename"),
            vehicle_models=[model.str("name") for model in models],
            default_targets=[str(t) for t in ota.list("default_targets")],
            targets_by_vehicle_model={
                str(model): [str(t) for t in by_model.list(model)] for model in by_model.values
            },
            timestamp_refresh_cron=ota.str("timestamp_refresh_cron"),
        )


def target_path(vehicle_model: str, engine_target: str, channel: str, filename: str) -> str:
    """The TUF target path of a channel's engine for one vehicle model and engine target."""
    return f"{vehicle_model}/{engine_target}/{channel}/{filename}"


def stored_target_key(path: str, sha256: str) -> str:
    """Where a target file lives in the lake: consistent-snapshot naming ``<hash>.<name>``."""
    directory, _, name = path.rpartition("/")
    return f"{OTA_TARGETS_PREFIX}{directory}/{sha256}.{name}"


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


def read_rollout_state(lake: VersionedLake, ref: str = MAIN_BRANCH) -> RolloutState | None:
    """The current rollout (``release/rollout/current.json`` → ``<version>.json``), if any;
    a ``current.json`` naming a missing state is refused, not read as "no rollout"."""
    version = current_version(lake, ref)
    if version is None:
        return None
    state = read_state(lake, version, ref)
    if state is None:
        key = rollout_state_key(version)
        raise OtaError(f"{CURRENT_ROLLOUT_KEY} names model version {version} but {key} is missing")
    return state


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
    settings = settings or OtaSettings.load()
    problems: list[str] = []
    offers: list[EngineOffer] = []
    production_version: str | None = None
    pointer = lake.get_json_or_none(ref, PRODUCTION_POINTER_KEY)
    if pointer is not None:
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
        and state.status in CANDIDATE_STATUSES
        and state.model_version != production_version
    ):
        offer = _certified_offer(
            lake,
            ref,
            CANDIDATE_CHANNEL,
            state.model_version,
            state.engine_sha256,
            public_keys,
            problems,
            cohort_percent=state.cohort_percent,
            cohort_salt=state.cohort_salt,
            rollout_stage=state.stage,
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
    """The current version of each role on ``main`` (None before the first publication), as
    signed metadata says — never as file names say — with each file's stored bytes (what
    snapshot and timestamp hash) and the files that were ignored, and why."""

    root: Metadata[Root] | None = None
    targets: Metadata[Targets] | None = None
    snapshot: Metadata[Snapshot] | None = None
    timestamp: Metadata[Timestamp] | None = None
    raw: dict[str, bytes] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    def version(self, role: str) -> int:
        metadata = getattr(self, role)
        return metadata.signed.version if metadata is not None else 0


def metadata_key(role: str, version: int | None = None) -> str:
    return (
        f"{OTA_METADATA_PREFIX}{role}.json"
        if version is None
        else (f"{OTA_METADATA_PREFIX}{version}.{role}.json")
    )


def _parse(data: bytes, key: str) -> Metadata:
    try:
        return Metadata.from_bytes(data)
    except DeserializationError as error:
        raise OtaError(f"{key} is not TUF metadata ({error}); refusing to build on it") from error


def _trusted_roots(lake: VersionedLake, ref: str) -> tuple[Metadata[Root], bytes]:
    """Root as a vehicle walks it: ``1.root.json`` signed by its own keys, then each
    ``<n+1>.root.json`` while it exists, signed by root n's keys and its own. A file in that
    chain that does not verify stops the walk with an error (a vehicle would stop there
    too); any other root file is never read."""
    key = metadata_key(Root.type, 1)
    data = lake.get_object(ref, key)
    root = _parse(data, key)
    if root.signed.type != Root.type or root.signed.version != 1:
        raise OtaError(f"{key} holds {root.signed.type} v{root.signed.version}, not root v1")
    try:
        root.signed.verify_delegate(Root.type, root.signed_bytes, root.signatures)
    except tuf_exceptions.UnsignedMetadataError as error:
        raise OtaError(f"{key} is not signed by its own root keys: {error}") from error
    while lake.object_exists(ref, key := metadata_key(Root.type, root.signed.version + 1)):
        wanted = root.signed.version + 1
        data = lake.get_object(ref, key)
        new = _parse(data, key)
        if new.signed.type != Root.type or new.signed.version != wanted:
            raise OtaError(
                f"{key} holds {new.signed.type} v{new.signed.version}, not root v{wanted}: "
                "vehicles stop at it too; remove it or publish the real root"
            )
        verified = new.signed.get_root_verification_result(
            root.signed, new.signed_bytes, new.signatures
        )
        if not verified.verified:
            raise OtaError(
                f"{key} is not signed by root v{wanted - 1}'s keys and its own: vehicles stop "
                "at it too; remove it or publish the real root"
            )
        root = new
    return root, data


def load_repository(lake: VersionedLake, ref: str = MAIN_BRANCH) -> RepositoryState:
    """The current version of every role, from verified signed metadata only.

    Root: the chain a vehicle walks from ``1.root.json`` (:func:`_trusted_roots`). Every
    other role: the highest version ``n`` among ``<n>.<role>.json`` whose content *is* that
    role at version ``n``, signed by its keys under the trusted root. A file named for a
    version it does not hold (an old snapshot copied to ``99.snapshot.json``), signed by
    other keys, or not metadata at all is ignored and listed in ``ignored``: it can neither
    raise nor lower what gets signed next. The unversioned ``timestamp.json`` / ``root.json``
    are what vehicles fetch, never what the signer trusts.
    """
    state = RepositoryState()
    keys = [stat.key for stat in lake.list_objects(ref, OTA_METADATA_PREFIX)]
    if not keys:
        return state
    if metadata_key(Root.type, 1) not in keys:
        raise OtaError(
            f"{OTA_METADATA_PREFIX} holds role metadata but no 1.root.json: repository is corrupt"
        )
    state.root, state.raw[Root.type] = _trusted_roots(lake, ref)
    for key in sorted(keys):
        match = _VERSIONED_NAME.match(key[len(OTA_METADATA_PREFIX) :])
        if not match or match.group(2) == Root.type:
            continue
        role, version = match.group(2), int(match.group(1))
        if version <= state.version(role):
            continue
        data = lake.get_object(ref, key)
        problem = _unverified(state.root, role, version, data)
        if problem:
            state.ignored.append(f"{key}: {problem}")
            continue
        setattr(state, role, Metadata.from_bytes(data))
        state.raw[role] = data
    missing = [role for role in TUF_ROLES if role != Root.type and getattr(state, role) is None]
    if missing:
        raise OtaError(
            f"no {', '.join(missing)} metadata on {ref} verifies against root "
            f"v{state.root.signed.version} (ignored: {'; '.join(state.ignored) or 'none'}); "
            "refusing to build on it"
        )
    return state


def _unverified(root: Metadata[Root], role: str, version: int, data: bytes) -> str | None:
    """Why ``data`` is not ``role`` v``version`` signed under ``root`` (None when it is)."""
    try:
        metadata = Metadata.from_bytes(data)
    except DeserializationError as error:
        return f"not TUF metadata ({str(error)[:120]})"
    if metadata.signed.type != role or metadata.signed.version != version:
        return f"holds {metadata.signed.type} v{metadata.signed.version}, not {role} v{version}"
    try:
        root.signed.verify_delegate(role, metadata.signed_bytes, metadata.signatures)
    except tuf_exceptions.UnsignedMetadataError as error:
        return f"not signed by the {role} keys of root v{root.signed.version} ({error})"
    return None


def root_metadata(lake: VersionedLake, version: int | None = None, ref: str = MAIN_BRANCH) -> bytes:
    """Root metadata bytes (newest, or ``version``): what a vehicle is provisioned to trust."""
    key = metadata_key(Root.type, version)
    if not lake.object_exists(ref, key):
        raise OtaError(f"no OTA root metadata at {key} on {ref}: run ota_release first")
    return lake.get_object(ref, key)
