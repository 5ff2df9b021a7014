"""Resumable uploads for ``LocalLake``, with the S3 multipart semantics lakeFS's gateway has.

A car on a bad network sends a log in parts and must be able to die between any two of them.
Each open upload is a folder under ``<lake root>/uploads/<upload id>/``: ``upload.json`` names
its repository, branch and key; every part is written to a temporary file, fsynced and renamed
into place (``part-00001``), so a part is either whole or absent. Completion checks the parts
as S3 does (consecutive numbers, matching ETags, non-final parts at least ``min_part_bytes``)
and streams them, block by block, into the content store (``assemble``: a drive log is GB and
never joined in memory); the lake then stages the object and removes the folder. Nothing is
visible on the branch before completion.

An upload id comes back from a car, so it is input, not a path: only the ids ``begin`` makes
(32 lowercase hex digits) are accepted, and the folder they name must resolve under the
uploads folder — ``../objects`` handed to an abort must not delete the object store. An abort
removes only an upload opened for the same branch and key.

ETags are the MD5 hex of the part's bytes, as S3 computes them for unencrypted parts.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from aiinfra_pipelines.durable import write_durably

from .errors import InvalidKeyError, LakeError, NotFoundError
from .files import read_blocks
from .port import MAX_UPLOAD_PARTS, UploadHandle

UPLOADS_DIRNAME = "uploads"
MANIFEST = "upload.json"
MAX_PART_NUMBER = MAX_UPLOAD_PARTS  # S3's limit
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")  # uuid4().hex, what begin() hands out


def part_etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _file_etag(path: Path) -> str:
    """``part_etag`` of a stored part, read in blocks."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for block in read_blocks(handle):
            digest.update(block)
    return digest.hexdigest()


class LocalUploads:
    """The uploads folder of one lake root; the lake passes itself in for the final put."""

    def __init__(self, root: Path, repository: str) -> None:
        self.folder = root / UPLOADS_DIRNAME
        self.repository = repository

    def _folder_of(self, upload_id: str) -> Path:
        """The folder an upload id names, refused unless it is an id this lake hands out and
        the folder stays under the uploads folder."""
        if not isinstance(upload_id, str) or not _UPLOAD_ID.match(upload_id):
            raise InvalidKeyError(
                f"invalid upload id {str(upload_id)[:80]!r}: expected 32 lowercase hex digits"
            )
        path = (self.folder / upload_id).resolve()
        if path.parent != self.folder.resolve():
            raise InvalidKeyError(f"upload id {upload_id!r} leaves the uploads folder")
        return path

    def _dir(self, upload: UploadHandle) -> Path:
        path = self._folder_of(upload.upload_id)
        manifest = path / MANIFEST
        if not manifest.is_file():
            raise NotFoundError(f"upload {upload.upload_id} is not open (completed or aborted)")
        opened = json.loads(manifest.read_text())
        if (opened["repository"], opened["branch"], opened["key"]) != (
            self.repository,
            upload.branch,
            upload.key,
        ):
            raise NotFoundError(
                f"upload {upload.upload_id} is for {opened['branch']}:{opened['key']} in "
                f"{opened['repository']}, not {upload.branch}:{upload.key}"
            )
        return path

    def begin(self, branch: str, key: str) -> UploadHandle:
        upload = UploadHandle(branch=branch, key=key, upload_id=uuid.uuid4().hex)
        path = self.folder / upload.upload_id
        path.mkdir(parents=True)
        write_durably(
            path / MANIFEST,
            json.dumps({"repository": self.repository, "branch": branch, "key": key}).encode(),
        )
        return upload

    def put_part(self, upload: UploadHandle, part_number: int, data: bytes) -> str:
        if not 1 <= int(part_number) <= MAX_PART_NUMBER:
            raise LakeError(f"part number {part_number} outside 1..{MAX_PART_NUMBER}")
        path = self._dir(upload)
        write_durably(path / f"part-{int(part_number):05d}", bytes(data))
        return part_etag(bytes(data))

    def parts(self, upload: UploadHandle) -> dict[int, str]:
        path = self._dir(upload)
        return {
            int(part.name.split("-", 1)[1]): _file_etag(part)
            for part in sorted(path.glob("part-*"))
        }

    def assemble(
        self, upload: UploadHandle, parts: dict[int, str], min_part_bytes: int
    ) -> Iterator[bytes]:
        """The object's bytes in blocks, part after part, for ``local_blobs.write_blob_stream``.

        What S3 checks without reading data (the upload is open, parts numbered 1..n, all
        arrived, non-final ones at least ``min_part_bytes``) is checked here, before anything
        is written; each part's ETag is checked as it streams by, and a mismatch raises
        ``LakeError`` from the iterator, which makes the store discard what it wrote.
        """
        path = self._dir(upload)
        numbers = sorted(int(n) for n in parts)
        if not numbers or numbers != list(range(1, len(numbers) + 1)):
            raise LakeError(f"upload {upload.upload_id}: parts must be 1..n, got {numbers}")
        files = []
        for number in numbers:
            file = path / f"part-{number:05d}"
            if not file.is_file():
                raise LakeError(f"upload {upload.upload_id}: part {number} never arrived")
            size = file.stat().st_size
            if number != numbers[-1] and size < min_part_bytes:
                raise LakeError(
                    f"upload {upload.upload_id}: part {number} is {size} bytes; every "
                    f"part but the last needs at least {min_part_bytes} (EntityTooSmall)"
                )
            files.append((number, file))
        return self._verified_blocks(upload, files, parts)

    @staticmethod
    def _verified_blocks(
        upload: UploadHandle, files: list[tuple[int, Path]], parts: dict[int, str]
    ) -> Iterator[bytes]:
        for number, file in files:
            digest = hashlib.md5(usedforsecurity=False)
            with file.open("rb") as handle:
                for block in read_blocks(handle):
                    digest.update(block)
                    yield block
            if digest.hexdigest() != parts[number]:
                raise LakeError(f"upload {upload.upload_id}: part {number} ETag mismatch")

    def discard(self, upload: UploadHandle) -> None:
        """Remove an open upload of this branch and key; one already gone is no error."""
        path = self._folder_of(upload.upload_id)
        if not path.exists():
            return
        if (path / MANIFEST).is_file():
            self._dir(upload)  # refuses another branch's or key's upload
        shutil.rmtree(path, ignore_errors=True)
