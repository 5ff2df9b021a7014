"""Certification: every gate re-verified from the published reports, and a signed record of it.

The gates ran in earlier layers and runs; certification trusts none of those runs, only what is
on ``main``: the candidate manifest, each gate's report (present, ``passed: true``, for the
same model version, byte-identical to the hash the manifest recorded) and the engine and ONNX
files (hashes as the manifest says). It also runs the shipped engine itself, in fresh sessions
on the same frames, and refuses one whose outputs are not bit-identical (:mod:`.determinism`).
The certificate binds all those hashes, and that check's result, under an Ed25519 signature,
so changing any of them later — a report edited on ``main``, an engine swapped — fails
``verify_certificate``, which every release step calls before it acts.

Gathering that evidence is :mod:`.certificate_evidence`; this module signs it into a
certificate, verifies certificates against the lake, and publishes them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from aiinfra_pipelines.lake.encoding import canonical_json, json_document
from aiinfra_pipelines.lake.layout import (
    LATEST_CANDIDATE_KEY,
    MAIN_BRANCH,
    candidate_certificate_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects

from .certificate_evidence import (
    CandidateEvidence,
    GateFailure,
    collect_evidence,
    read_if_exists,
    sha256_hex,
)
from .determinism import DeterminismSettings
from .keys import key_id

CERTIFICATE_SCHEMA = "aiinfra.certificate/v1"
SIGNATURE_ALGORITHM = "ed25519"


class CertificationRefused(Exception):
    """A candidate failed one or more gates; ``failures`` names every one of them."""

    def __init__(self, model_version: str, failures: list[GateFailure]) -> None:
        self.model_version = model_version
        self.failures = failures
        super().__init__(refusal_message(model_version, failures))

    @property
    def failed_gates(self) -> list[str]:
        return sorted({failure.gate for failure in self.failures})

    def __reduce__(self):  # type: ignore[override]
        # Dagster ships errors across processes; rebuild from the constructor arguments.
        return (type(self), (self.model_version, self.failures))


class CertificateError(Exception):
    """A certificate is missing, malformed, not validly signed, or no longer matches the lake."""


def latest_candidate(lake: VersionedLake, ref: str = MAIN_BRANCH) -> str:
    """The newest published candidate's model version (``candidates/latest.json``)."""
    if not lake.object_exists(ref, LATEST_CANDIDATE_KEY):
        raise CertificateError(
            f"no published candidate: {LATEST_CANDIDATE_KEY} is not on {ref} "
            "(materialize published_engine first)"
        )
    return str(lake.get_json(ref, LATEST_CANDIDATE_KEY)["model_version"])


def refusal_message(model_version: str, failures: list[GateFailure]) -> str:
    gates = sorted({failure.gate for failure in failures})
    details = "; ".join(f"{failure.gate}: {failure.reason}" for failure in failures)
    return (
        f"candidate model version {model_version} refused: {len(gates)} gate(s) failed "
        f"({', '.join(gates)}) — {details}"
    )


# ------------------------------------------------------------------------ signing, checking
def build_certificate(
    evidence: CandidateEvidence,
    *,
    signer: Ed25519PrivateKey,
    issued_at: datetime | None = None,
    issued_by: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The signed certificate document for a candidate that passed every gate."""
    if not evidence.passed or evidence.manifest is None:
        raise CertificationRefused(evidence.model_version, evidence.failures)
    manifest = evidence.manifest
    ship = manifest["ship"]
    engine_bytes = (manifest.get("engines") or {}).get(ship.get("precision"), {}).get("bytes")
    body = {
        "schema": CERTIFICATE_SCHEMA,
        "model_version": evidence.model_version,
        "registered_model": manifest.get("registered_model"),
        "mlflow_run_id": manifest.get("mlflow_run_id"),
        "model_uri": manifest.get("model_uri"),
        "dataset_version": manifest.get("dataset_version"),
        "dataset_commit": manifest.get("dataset_commit"),
        "code_version": manifest.get("code_version"),
        "manifest": {"key": evidence.manifest_key, "sha256": evidence.manifest_sha256},
        "onnx": {"key": manifest["onnx"]["key"], "sha256": manifest["onnx"]["sha256"]},
        "engine": {
            "key": ship["key"],
            "sha256": ship["sha256"],
            "precision": ship.get("precision"),
            "target": ship.get("target"),
            "bytes": engine_bytes,
        },
        "reports": {
            gate.gate: {
                "key": gate.key,
                "sha256": gate.sha256,
                "passed": gate.passed,
                "gates_sha256": gate.gates_sha256,
            }
            for gate in evidence.gates
        },
        # The rules that certified it: gates.yaml's hash and the error rates it states.
        "gates": None if evidence.rules is None else evidence.rules.to_dict(),
        "determinism": None if evidence.determinism is None else evidence.determinism.to_dict(),
        "issued_at": (issued_at or datetime.now(UTC)).isoformat(),
        "issued_by": dict(issued_by or {}),
        "key_id": key_id(signer.public_key()),
    }
    return sign_certificate(body, signer)


def sign_certificate(body: Mapping[str, Any], signer: Ed25519PrivateKey) -> dict[str, Any]:
    signature = signer.sign(canonical_json(body))
    return {
        "certificate": dict(body),
        "signature": {
            "algorithm": SIGNATURE_ALGORITHM,
            "key_id": key_id(signer.public_key()),
            "value": base64.b64encode(signature).decode(),
        },
    }


def _trusted(public_keys: Ed25519PublicKey | Iterable[Ed25519PublicKey]) -> dict[str, Any]:
    keys = [public_keys] if isinstance(public_keys, Ed25519PublicKey) else list(public_keys)
    if not keys:
        raise CertificateError("no trusted public key given to verify the certificate with")
    return {key_id(key): key for key in keys}


def verify_signature(
    document: Mapping[str, Any], public_keys: Ed25519PublicKey | Iterable[Ed25519PublicKey]
) -> dict[str, Any]:
    """The certificate body, once its signature verifies with one of ``public_keys``."""
    try:
        body = document["certificate"]
        signature = document["signature"]
        algorithm, signer_id = signature["algorithm"], signature["key_id"]
        value = base64.b64decode(signature["value"], validate=True)
    except (KeyError, TypeError, ValueError) as error:
        raise CertificateError(f"malformed certificate: {error!r}") from None
    if algorithm != SIGNATURE_ALGORITHM:
        raise CertificateError(f"unsupported signature algorithm {algorithm!r}")
    trusted = _trusted(public_keys)
    if signer_id not in trusted:
        raise CertificateError(
            f"certificate signed by unknown key {str(signer_id)[:16]}; trusted: "
            f"{', '.join(k[:16] for k in trusted)}"
        )
    try:
        trusted[signer_id].verify(value, canonical_json(body))
    except InvalidSignature:
        raise CertificateError(
            "bad signature: the certificate was altered after signing or was not signed by "
            f"key {str(signer_id)[:16]}"
        ) from None
    return dict(body)


def verify_certificate(
    lake: VersionedLake,
    model_version: str,
    public_keys: Ed25519PublicKey | Iterable[Ed25519PublicKey],
    ref: str = MAIN_BRANCH,
) -> dict[str, Any]:
    """Check ``model_version``'s certificate on ``ref`` and everything it vouches for.

    Returns the certified body plus ``certificate_key`` and ``certificate_sha256``. Raises
    ``CertificateError`` naming the problem: missing, malformed, bad signature or unknown key,
    issued for another version, or — after the signature holds — every report, engine or ONNX
    file whose bytes on ``ref`` no longer match the certified hash (tampered or missing).
    """
    model_version = str(model_version)
    key = candidate_certificate_key(model_version)
    data = read_if_exists(lake, ref, key)
    if data is None:
        raise CertificateError(f"model version {model_version} is not certified: no {key} on {ref}")
    try:
        document = json.loads(data)
    except ValueError as error:
        raise CertificateError(f"{key} is not valid JSON: {error}") from None
    body = verify_signature(document, public_keys)
    if str(body.get("model_version")) != model_version:
        raise CertificateError(
            f"{key} certifies model version {body.get('model_version')!r}, not {model_version!r}"
        )
    problems: list[str] = []
    certified = [(f"report {gate}", entry) for gate, entry in sorted(body["reports"].items())]
    certified += [("engine", body["engine"]), ("onnx", body["onnx"])]
    for label, entry in certified:
        current = read_if_exists(lake, ref, entry["key"])
        if current is None:
            problems.append(f"{label} missing ({entry['key']})")
        elif sha256_hex(current) != entry["sha256"]:
            problems.append(
                f"{label} {entry['key']} was changed after certification (tampered: sha256 "
                f"{sha256_hex(current)[:12]} != certified {entry['sha256'][:12]})"
            )
    if problems:
        raise CertificateError(
            f"certificate of model version {model_version} no longer holds: " + "; ".join(problems)
        )
    return {**body, "certificate_key": key, "certificate_sha256": sha256_hex(data)}


def certificate_matches(body: Mapping[str, Any], evidence: CandidateEvidence) -> bool:
    """Whether an existing certificate vouches for exactly the evidence found now."""
    manifest = evidence.manifest or {}
    current_reports = {gate.gate: gate.sha256 for gate in evidence.gates}
    certified_reports = {gate: entry["sha256"] for gate, entry in body["reports"].items()}
    return (
        current_reports == certified_reports
        and body["engine"]["sha256"] == (manifest.get("ship") or {}).get("sha256")
        and body["onnx"]["sha256"] == (manifest.get("onnx") or {}).get("sha256")
        # A certificate from before the determinism check does not vouch for it: re-issue.
        and _determinism_verdict(body.get("determinism"))
        == _determinism_verdict(
            None if evidence.determinism is None else evidence.determinism.to_dict()
        )
    )


def _determinism_verdict(result: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What a determinism result vouches for, without its output digests: another host's CPU
    kernels may produce other (equally repeatable) bits, and re-running certification there
    must not re-issue a certificate whose verdict still holds."""
    if result is None:
        return None
    fields = ("deterministic", "backend", "runs", "frames", "intra_op_threads")
    return tuple(result.get(name) for name in fields)


# ------------------------------------------------------------------------------- certifying
@dataclass(frozen=True)
class CertificationOutcome:
    """A certified candidate: the verified certificate body and where it is on ``main``."""

    model_version: str
    certificate: dict[str, Any]
    certificate_key: str
    certificate_sha256: str
    # The merge commit that published the certificate; None when a valid one was reused.
    commit: str | None

    @property
    def reused(self) -> bool:
        return self.commit is None


def certify_candidate(
    lake: VersionedLake,
    model_version: str,
    signer: Ed25519PrivateKey,
    *,
    root_run_id: str,
    issued_by: Mapping[str, str] | None = None,
    issued_at: datetime | None = None,
    determinism: DeterminismSettings | None = None,
) -> CertificationOutcome:
    """Certify ``model_version`` or raise ``CertificationRefused`` naming every failed gate.

    The certificate reaches ``main`` by write–audit–publish (run branch, commit, merge). A
    certificate already on ``main`` that verifies with this key and vouches for exactly the
    current evidence is kept rather than re-issued, so a re-run changes nothing downstream.
    """
    model_version = str(model_version)
    evidence = collect_evidence(lake, model_version, determinism=determinism)
    if not evidence.passed:
        raise CertificationRefused(model_version, evidence.failures)
    key = candidate_certificate_key(model_version)
    if lake.object_exists(MAIN_BRANCH, key):
        try:
            existing = verify_certificate(lake, model_version, signer.public_key())
        except CertificateError:
            existing = None  # signed by a rotated key or no longer valid: issue a new one
        if existing is not None and certificate_matches(existing, evidence):
            return CertificationOutcome(
                model_version, existing, key, existing["certificate_sha256"], None
            )
    document = build_certificate(evidence, signer=signer, issued_at=issued_at, issued_by=issued_by)
    data = json_document(document)
    commit = publish_objects(
        lake,
        root_run_id,
        {key: data},
        f"certificate for model version {model_version}",
        {
            "kind": "certificate",
            "model_version": model_version,
            "certificate_sha256": sha256_hex(data),
            "engine_sha256": str(document["certificate"]["engine"]["sha256"]),
        },
    )
    body = verify_certificate(lake, model_version, signer.public_key())
    return CertificationOutcome(model_version, body, key, body["certificate_sha256"], commit)
