"""Release signing keys: from the environment, or dev keys under DAGSTER_HOME; clear errors."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aiinfra_pipelines.release.keys import (
    CERTIFICATE_KEY_ENV,
    ReleaseKeys,
    SigningKeyError,
    key_id,
    load_or_create_dev_key,
    parse_private_keys,
    private_key_pem,
    public_key_hex,
    release_keys_for_environment,
    trusted_certificate_keys,
)

SEED_HEX = "11" * 32


def raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def test_hex_and_pem_keys_parse_and_derive_their_public_key():
    from_hex = parse_private_keys(SEED_HEX, "TEST_KEY")
    from_pem = parse_private_keys(private_key_pem(from_hex[0]).decode(), "TEST_KEY")

    assert raw_private(from_hex[0]) == bytes.fromhex(SEED_HEX)
    assert key_id(from_pem[0].public_key()) == key_id(from_hex[0].public_key())
    several = parse_private_keys(f"{SEED_HEX}, {'22' * 32}\n{'33' * 32}", "TEST_KEY")
    assert len({key_id(key.public_key()) for key in several}) == 3
    two_pem = b"".join(private_key_pem(Ed25519PrivateKey.generate()) for _ in range(2)).decode()
    assert len(parse_private_keys(two_pem, "TEST_KEY")) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc123", "AIINFRA_CERT_SIGNING_KEY: key 1 has 6 characters"),
        ("zz" * 32, "AIINFRA_CERT_SIGNING_KEY: key 1 is not valid hex"),
        (f"{SEED_HEX},{'1' * 63}", "key 2 has 63 characters"),
        ("-----BEGIN PRIVATE KEY-----\nnot base64\n", "without a complete BEGIN/END block"),
        ("   ", "AIINFRA_CERT_SIGNING_KEY is empty"),
    ],
)
def test_malformed_keys_are_clear_errors_that_never_echo_the_key(text, message):
    with pytest.raises(SigningKeyError, match=message) as error:
        parse_private_keys(text, CERTIFICATE_KEY_ENV)
    if len(text.strip()) > 8:
        assert text.strip()[:16] not in str(error.value)


def test_a_non_ed25519_pem_key_is_refused():
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    keys = ReleaseKeys(certificate_key=rsa_pem.decode())
    with pytest.raises(SigningKeyError, match="RSAPrivateKey; an Ed25519 key is required"):
        keys.certificate_signer()


def test_dev_keys_are_generated_once_private_and_shared_by_racing_processes(dagster_home):
    keys = ReleaseKeys()

    with ThreadPoolExecutor(max_workers=4) as pool:
        signers = list(pool.map(lambda _: keys.certificate_signer(), range(8)))

    path = dagster_home / "keys" / "release" / "certificate.pem"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len({raw_private(signer) for signer in signers}) == 1
    assert raw_private(load_or_create_dev_key(path)) == raw_private(signers[0])
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
    # Thresholds above one get that many distinct dev keys per role.
    targets = keys.tuf_signers("targets", minimum=2)
    assert len({raw_private(key) for key in targets}) == 2


def test_env_keys_win_over_dev_keys_and_are_required_where_configured(monkeypatch, dagster_home):
    assert ReleaseKeys(certificate_key=SEED_HEX).certificate_public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    ) == Ed25519PrivateKey.from_private_bytes(bytes.fromhex(SEED_HEX)).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    strict = ReleaseKeys(require_env_keys=True)
    with pytest.raises(SigningKeyError, match="AIINFRA_CERT_SIGNING_KEY is required"):
        strict.certificate_signer()
    with pytest.raises(SigningKeyError, match="AIINFRA_TUF_TIMESTAMP_KEY is required"):
        strict.tuf_signers("timestamp")
    with pytest.raises(SigningKeyError, match=r"holds 1 key.*threshold is 2"):
        ReleaseKeys(tuf_root_key=SEED_HEX).tuf_signers("root", minimum=2)
    assert not (dagster_home / "keys").exists(), "no dev key may be created for env keys"

    prod = release_keys_for_environment(require_env_keys=True)
    assert isinstance(prod.certificate_key, dg.EnvVar)
    assert isinstance(prod.tuf_timestamp_key, dg.EnvVar) and prod.require_env_keys
    monkeypatch.setenv("AIINFRA_TUF_TARGETS_KEY", SEED_HEX)
    local = release_keys_for_environment(require_env_keys=False)
    assert isinstance(local.tuf_targets_key, dg.EnvVar) and local.certificate_key == ""


def test_verifiers_get_public_keys_without_creating_keys(monkeypatch, dagster_home):
    for variable in (CERTIFICATE_KEY_ENV, "AIINFRA_CERT_PUBLIC_KEY"):
        monkeypatch.delenv(variable, raising=False)
    assert trusted_certificate_keys() == []
    assert not (dagster_home / "keys").exists()

    published = public_key_hex(Ed25519PrivateKey.generate().public_key())
    monkeypatch.setenv("AIINFRA_CERT_PUBLIC_KEY", published)
    monkeypatch.setenv(CERTIFICATE_KEY_ENV, SEED_HEX)
    dev = ReleaseKeys().certificate_public_key()  # creates the dev key (signing side)
    trusted = {public_key_hex(key) for key in trusted_certificate_keys()}
    expected_from_env = public_key_hex(parse_private_keys(SEED_HEX, "x")[0].public_key())
    assert trusted == {published, expected_from_env, public_key_hex(dev)}
