"""The file half of ``LocalLake``: object content stored once, named by its sha256.

A file is never modified after it is written, and reads verify it: it is written to a temp
file in the same directory, fsynced and ``os.replace``-d into place, then the directory is
fsynced, so a crash leaves at worst a stray temp file, never a truncated object.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import NamedTuple

from aiinfra_pipelines.lake.errors import LakeError

OBJECTS_DIRNAME = "objects"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Value(NamedTuple):
    """A key's content: sha256 of the bytes and their length."""

    sha: str
    size: int


def fsync_dir(path: Path) -> None:
    """Persist a directory entry (a rename or a new file); not supported everywhere."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def blob_path(objects_dir: Path, sha: str) -> Path:
    """Where the content with this sha256 lives; a name that is not a sha256 never becomes
    a path (it could climb out of the object store)."""
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise LakeError(f"not a sha256 content name: {str(sha)[:80]!r}")
    return objects_dir / sha[:2] / sha


def write_blob(objects_dir: Path, data: bytes) -> Value:
    sha = hashlib.sha256(data).hexdigest()
    path = blob_path(objects_dir, sha)
    try:
        if path.stat().st_size == len(data):
            # Already stored (content addressing dedups). Another process may have renamed
            # it into place without its directory fsync yet: make the entry durable first.
            fsync_dir(path.parent)
            return Value(sha, len(data))
    except FileNotFoundError:
        pass
    shard = path.parent
    if not shard.is_dir():
        shard.mkdir(parents=True, exist_ok=True)
        fsync_dir(shard.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{sha[:12]}-", dir=shard)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(shard)
    return Value(sha, len(data))


def read_blob(objects_dir: Path, value: Value, key: str) -> bytes:
    path = blob_path(objects_dir, value.sha)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise LakeError(
            f"content of {key!r} ({value.sha}) is missing from {path}: the store is damaged"
        ) from exc
    if hashlib.sha256(data).hexdigest() != value.sha:
        raise LakeError(f"content of {key!r} at {path} does not match its checksum {value.sha}")
    return data
