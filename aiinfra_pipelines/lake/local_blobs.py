"""The file half of ``LocalLake``: object content stored once, named by its sha256.

A file is never modified after it is written, and reads verify it: it is written to a temp
file, fsynced and ``os.replace``-d into place, then the directory is fsynced, so a crash leaves
at worst a stray temp file (``.tmp-*``), never a truncated object.

Content given as bytes (``write_blob``) is hashed first, so its temp file goes straight into
its shard and known content is not written at all. Content that arrives as a stream (a file,
an upload's parts: possibly GB, never held whole) is hashed while it is copied, in blocks, so
its name is known only at the end: its temp file sits in the objects folder itself, on the same
filesystem, so the final ``os.replace`` into the shard is still atomic, and it is read once.
Streamed reads (``copy_blob``) verify the sha256 the same way, block by block.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

from aiinfra_pipelines.lake.errors import LakeError
from aiinfra_pipelines.lake.files import fsync_dir, read_blocks

__all__ = [
    "OBJECTS_DIRNAME",
    "Value",
    "blob_path",
    "copy_blob",
    "fsync_dir",
    "read_blob",
    "write_blob",
    "write_blob_from_file",
    "write_blob_stream",
]

OBJECTS_DIRNAME = "objects"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Value(NamedTuple):
    """A key's content: sha256 of the bytes and their length."""

    sha: str
    size: int


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


def write_blob_stream(objects_dir: Path, blocks: Iterable[bytes]) -> Value:
    """Store the concatenation of ``blocks``, hashing and writing one block at a time.

    Same durability as ``write_blob`` (temp file, fsync, ``os.replace``, directory fsync); if
    ``blocks`` raises (a part whose ETag does not match, a read error) nothing is stored and
    the temp file is removed. Content already stored is kept as it is (dedup).
    """
    objects_dir.mkdir(parents=True, exist_ok=True)
    temporary = objects_dir / f".tmp-stream-{uuid.uuid4().hex}"
    digest = hashlib.sha256()
    size = 0
    try:
        with temporary.open("xb") as handle:
            for block in blocks:
                digest.update(block)
                handle.write(block)
                size += len(block)
            handle.flush()
            os.fsync(handle.fileno())
        sha = digest.hexdigest()
        path = blob_path(objects_dir, sha)
        try:
            stored = path.stat().st_size == size
        except FileNotFoundError:
            stored = False
        if stored:
            temporary.unlink()
            fsync_dir(path.parent)  # another writer's rename may not be durable yet
            return Value(sha, size)
        shard = path.parent
        if not shard.is_dir():
            shard.mkdir(exist_ok=True)
            fsync_dir(objects_dir)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(shard)
    return Value(sha, size)


def write_blob_from_file(objects_dir: Path, source: str | os.PathLike[str]) -> Value:
    """Store the content of the file ``source``, read in blocks (never whole)."""
    with open(source, "rb") as handle:
        return write_blob_stream(objects_dir, read_blocks(handle))


def copy_blob(objects_dir: Path, value: Value, key: str, sink: BinaryIO) -> None:
    """Write the content ``value`` names to ``sink`` in blocks, verifying its sha256 and size
    as ``read_blob`` does; on a mismatch ``LakeError`` is raised after the bad bytes were
    written, so the caller must discard ``sink`` (``files.replacing_file`` does)."""
    path = blob_path(objects_dir, value.sha)
    try:
        handle = path.open("rb")
    except FileNotFoundError as exc:
        raise LakeError(
            f"content of {key!r} ({value.sha}) is missing from {path}: the store is damaged"
        ) from exc
    digest = hashlib.sha256()
    size = 0
    with handle:
        for block in read_blocks(handle):
            digest.update(block)
            sink.write(block)
            size += len(block)
    if size != value.size or digest.hexdigest() != value.sha:
        raise LakeError(f"content of {key!r} at {path} does not match its checksum {value.sha}")
