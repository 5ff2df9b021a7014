"""Validation of object keys, prefixes, branch names and tag names.

Keys are validated once, here, before any adapter touches storage: ``LocalLake`` maps keys onto
a database and lakeFS onto object-store paths, and a key such as ``../x`` or ``a//b`` would mean
different things (or escape the repository) on each. Rejecting them up front keeps both adapters
on the same, unambiguous key space.
"""

from __future__ import annotations

import re

from aiinfra_pipelines.lake.errors import InvalidKeyError

# lakeFS's own branch-name rule. ``re.ASCII`` because Go's ``\w`` (the server) is ASCII-only.
_BRANCH_RE = re.compile(r"^\w[-\w]*$", re.ASCII)
# Tags name datasets (``dataset-v0007``); dots are allowed for versions like ``v1.2``.
_TAG_RE = re.compile(r"^\w[-\w.]*$", re.ASCII)
_MAX_KEY_BYTES = 1024


def _has_control(text: str) -> bool:
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)


def _check_segments(key: str, what: str, allow_trailing_slash: bool) -> None:
    if key.startswith("/"):
        raise InvalidKeyError(f"invalid {what} {key!r}: must be relative (no leading '/')")
    if "\\" in key:
        raise InvalidKeyError(f"invalid {what} {key!r}: backslashes are not allowed, use '/'")
    if _has_control(key):
        raise InvalidKeyError(f"invalid {what} {key!r}: contains control characters")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"invalid {what} {key!r}: not encodable as UTF-8") from exc
    if len(encoded) > _MAX_KEY_BYTES:
        raise InvalidKeyError(f"invalid {what} {key!r}: longer than {_MAX_KEY_BYTES} bytes")
    segments = key.split("/")
    if allow_trailing_slash and segments[-1] == "":
        segments = segments[:-1]
    for segment in segments:
        if segment == "":
            raise InvalidKeyError(
                f"invalid {what} {key!r}: empty path segment ('//' or trailing '/')"
            )
        if segment in (".", ".."):
            raise InvalidKeyError(f"invalid {what} {key!r}: '.' and '..' segments are not allowed")


def validate_key(key: str) -> str:
    """Return ``key`` unchanged if it is a valid object key, else raise ``InvalidKeyError``.

    A key is a relative, '/'-separated path: non-empty, no leading or trailing '/', no empty,
    '.' or '..' segments, no backslashes and no control characters.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"invalid key {key!r}: must be a string")
    if key == "":
        raise InvalidKeyError("invalid key '': must not be empty")
    _check_segments(key, "key", allow_trailing_slash=False)
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid listing prefix (``""`` or a key start), else raise.

    A prefix follows the key rules except that it may be empty or end with '/'; it is matched
    as a plain string prefix, so ``"logs/2024"`` matches ``"logs/2024-01/a.mcap"``.
    """
    if not isinstance(prefix, str):
        raise InvalidKeyError(f"invalid prefix {prefix!r}: must be a string")
    if prefix == "":
        return prefix
    _check_segments(prefix, "prefix", allow_trailing_slash=True)
    return prefix


def validate_branch_name(name: str) -> str:
    """Return ``name`` if it is a valid lakeFS branch name (``^\\w[-\\w]*$``), else raise.

    No slashes: ingest branches are therefore named ``ingest-<batch>``, not ``ingest/<batch>``.
    """
    if not isinstance(name, str) or not _BRANCH_RE.match(name):
        raise InvalidKeyError(
            f"invalid branch name {name!r}: must match ^\\w[-\\w]*$ (letters, digits, '_' and "
            "'-', starting with a letter, digit or '_'; no '/')"
        )
    return name


def validate_tag_name(name: str) -> str:
    """Return ``name`` if it is a valid tag name (``^\\w[-\\w.]*$``, no ``..``), else raise."""
    if not isinstance(name, str) or not _TAG_RE.match(name) or ".." in name:
        raise InvalidKeyError(
            f"invalid tag name {name!r}: must match ^\\w[-\\w.]*$ and must not contain '..'"
        )
    return name
