"""Release signing keys: the certificate key and the TUF role keys, all Ed25519.

In shared environments every key comes from the environment (``dg.EnvVar``), never from a file
in the repository; on a laptop or in CI an empty setting means "use the dev key generated once
under ``DAGSTER_HOME/keys/``" (mode 0600, git-ignored), so the loop runs with no setup while
the same code refuses to run without real keys where ``require_env_keys`` is set.

A key setting holds one or more Ed25519 private keys: PKCS#8 PEM blocks, or 32-byte seeds as
64 hex characters separated by commas or whitespace (several keys let a role meet a TUF
threshold above one). Public keys derive from the private ones, so verifiers need no extra
configuration.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path

import dagster as dg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import Field

from aiinfra_pipelines.config import dagster_home

CERTIFICATE_KEY_ENV = "AIINFRA_CERT_SIGNING_KEY"
TUF_ROLES = ("root", "targets", "snapshot", "timestamp")
DEV_KEYS_SUBDIR = ("keys", "release")
_SEED_HEX_CHARS = 64
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.DOTALL)


class SigningKeyError(ValueError):
    """A signing key is missing or malformed; the message names the setting, never the key."""


def tuf_key_env(role: str) -> str:
    """The environment variable that holds the private key(s) of TUF role ``role``."""
    if role not in TUF_ROLES:
        raise SigningKeyError(f"unknown TUF role {role!r} (expected one of {', '.join(TUF_ROLES)})")
    return f"AIINFRA_TUF_{role.upper()}_KEY"


def key_id(public_key: Ed25519PublicKey) -> str:
    """A stable identifier of a public key: SHA-256 of its raw 32 bytes, hex."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    """The raw public key as hex: what an operator distributes to verifiers."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_public_key_hex(text: str) -> Ed25519PublicKey:
    """Parse a raw Ed25519 public key given as 64 hex characters."""
    try:
        raw = bytes.fromhex(text.strip())
    except ValueError as error:
        raise SigningKeyError("public key is not hex") from error
    if len(raw) != 32:
        raise SigningKeyError(f"an Ed25519 public key has 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def parse_private_keys(text: str, source: str) -> list[Ed25519PrivateKey]:
    """Every Ed25519 private key in ``text`` (PEM blocks or hex seeds), in order.

    ``source`` names the setting in error messages (e.g. the environment variable); the key
    material itself is never echoed.
    """
    data = text.strip().encode()
    if not data:
        raise SigningKeyError(f"{source} is empty")
    if b"-----BEGIN" in data:
        blocks = [match.group(0) for match in _PEM_BLOCK.finditer(data)]
        if not blocks:
            raise SigningKeyError(f"{source}: PEM text without a complete BEGIN/END block")
        return [_load_pem(block, source, index) for index, block in enumerate(blocks, 1)]
    entries = [entry for entry in re.split(r"[\s,]+", data.decode()) if entry]
    return [_load_hex_seed(entry, source, index) for index, entry in enumerate(entries, 1)]


def _load_pem(block: bytes, source: str, index: int) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(block, password=None)
    except (ValueError, TypeError) as error:
        raise SigningKeyError(
            f"{source}: PEM block {index} is not an unencrypted PKCS#8 private key ({error})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"{source}: PEM block {index} is a {type(key).__name__}; an Ed25519 key is required"
        )
    return key


def _load_hex_seed(entry: str, source: str, index: int) -> Ed25519PrivateKey:
    if len(entry) != _SEED_HEX_CHARS:
        raise SigningKeyError(
            f"{source}: key {index} has {len(entry)} characters; an Ed25519 seed is "
            f"{_SEED_HEX_CHARS} hex characters (or use a PKCS#8 PEM block)"
        )
    try:
        seed = bytes.fromhex(entry)
    except ValueError:
        raise SigningKeyError(f"{source}: key {index} is not valid hex") from None
    return Ed25519PrivateKey.from_private_bytes(seed)


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM: how dev keys are stored, and what ``parse_private_keys`` reads."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_or_create_dev_key(path: Path) -> Ed25519PrivateKey:
    """The dev key at ``path``, generated on first use (mode 0600 in a 0700 folder).

    Created in a temporary file and hard-linked into place, so two processes starting at once
    never see a half-written key: the loser of the race reads the winner's key.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                os.fchmod(handle.fileno(), 0o600)
                handle.write(
                    private_key_pem(Ed25519PrivateKey.from_private_bytes(secrets.token_bytes(32)))
                )
            with contextlib.suppress(FileExistsError):  # another process won: use its key
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
    keys = parse_private_keys(path.read_text(), f"dev key {path}")
    if len(keys) != 1:
        raise SigningKeyError(f"dev key {path} must hold exactly one key, found {len(keys)}")
    return keys[0]


class ReleaseKeys(dg.ConfigurableResource):
    """The private keys the release layer signs with: certificates and TUF metadata.

    Fields hold key text; deployments set them with ``dg.EnvVar`` (``AIINFRA_CERT_SIGNING_KEY``,
    ``AIINFRA_TUF_<ROLE>_KEY``) so secrets resolve in the run worker only. An empty field falls
    back to a dev key under ``DAGSTER_HOME`` unless ``require_env_keys`` is set (prod), where
    it is a clear error instead: a pod-local key would sign releases nobody else can verify.
    """

    # Private keys are never shown by repr()/str() (they end up in logs and error messages).
    certificate_key: str = Field(default="", repr=False)
    tuf_root_key: str = Field(default="", repr=False)
    tuf_targets_key: str = Field(default="", repr=False)
    tuf_snapshot_key: str = Field(default="", repr=False)
    tuf_timestamp_key: str = Field(default="", repr=False)
    require_env_keys: bool = False
    # Where dev keys live; empty = <DAGSTER_HOME>/keys/release.
    dev_keys_dir: str = ""

    def _dev_dir(self) -> Path:
        return (
            Path(self.dev_keys_dir)
            if self.dev_keys_dir
            else dagster_home().joinpath(*DEV_KEYS_SUBDIR)
        )

    def _configured(self, text: str, env_name: str) -> list[Ed25519PrivateKey] | None:
        if text.strip():
            return parse_private_keys(text, env_name)
        if self.require_env_keys:
            raise SigningKeyError(
                f"{env_name} is required in this environment and is not set: release keys "
                "must come from the environment, never from a dev key"
            )
        return None

    def certificate_signer(self) -> Ed25519PrivateKey:
        """The one key certificates are signed with."""
        keys = self._configured(self.certificate_key, CERTIFICATE_KEY_ENV)
        if keys is None:
            return load_or_create_dev_key(self._dev_dir() / "certificate.pem")
        if len(keys) != 1:
            raise SigningKeyError(
                f"{CERTIFICATE_KEY_ENV} must hold exactly one key, found {len(keys)}"
            )
        return keys[0]

    def certificate_public_key(self) -> Ed25519PublicKey:
        """What verifiers check a certificate's signature against."""
        return self.certificate_signer().public_key()

    def tuf_signers(self, role: str, minimum: int = 1) -> list[Ed25519PrivateKey]:
        """The private keys of TUF role ``role``; at least ``minimum`` (the role's threshold).

        Dev mode generates exactly ``minimum`` keys, so a threshold above one works locally.
        """
        env_name = tuf_key_env(role)
        keys = self._configured(getattr(self, f"tuf_{role}_key"), env_name)
        if keys is None:
            return [
                load_or_create_dev_key(self._dev_dir() / f"tuf-{role}-{index}.pem")
                for index in range(1, minimum + 1)
            ]
        if len(keys) < minimum:
            raise SigningKeyError(
                f"{env_name} holds {len(keys)} key(s) but the {role} role's threshold is "
                f"{minimum}: add keys or lower the threshold in resources/release.yaml"
            )
        return keys


def release_keys_for_environment(require_env_keys: bool) -> ReleaseKeys:
    """``ReleaseKeys`` for ``build_resources``: every key from ``dg.EnvVar`` where required.

    Where keys are not required, a variable set anyway is still used (a developer testing with
    real keys); unset ones fall back to dev keys.
    """
    fields = {"certificate_key": CERTIFICATE_KEY_ENV} | {
        f"tuf_{role}_key": tuf_key_env(role) for role in TUF_ROLES
    }
    values = {
        field: dg.EnvVar(env_name)
        for field, env_name in fields.items()
        if require_env_keys or os.environ.get(env_name)
    }
    return ReleaseKeys(**values, require_env_keys=require_env_keys)


CERTIFICATE_PUBLIC_KEY_ENV = "AIINFRA_CERT_PUBLIC_KEY"


def trusted_certificate_keys(
    extra_public_hex: list[str] | None = None, dev_keys_dir: str = ""
) -> list[Ed25519PublicKey]:
    """Public keys a *verifier* (CLI, auditor) trusts, without creating any key.

    From, in order: ``extra_public_hex``; ``AIINFRA_CERT_PUBLIC_KEY`` (hex, comma-separated);
    the public half of ``AIINFRA_CERT_SIGNING_KEY``; the dev certificate key if one exists.
    Empty when none is available, and the caller then reports certificates as unverified.
    """
    keys = [load_public_key_hex(text) for text in extra_public_hex or [] if text.strip()]
    published = os.environ.get(CERTIFICATE_PUBLIC_KEY_ENV, "")
    keys += [load_public_key_hex(text) for text in re.split(r"[\s,]+", published) if text]
    signing = os.environ.get(CERTIFICATE_KEY_ENV, "")
    if signing.strip():
        keys += [key.public_key() for key in parse_private_keys(signing, CERTIFICATE_KEY_ENV)]
    dev_dir = Path(dev_keys_dir) if dev_keys_dir else dagster_home().joinpath(*DEV_KEYS_SUBDIR)
    if (dev_dir / "certificate.pem").exists():
        keys.append(load_or_create_dev_key(dev_dir / "certificate.pem").public_key())
    return keys
