"""Local files on either end of a lake transfer, moved in blocks so memory stays bounded.

A drive log is several GB and an ingest worker has well under that in RAM, so
``VersionedLake.upload_file``/``download_object`` never hold an object whole: they copy it
``BLOCK_BYTES`` at a time. A download lands under its final name only once it is complete
(``replacing_file``), so a reader never sees half a log and a failed download leaves the old
file, if there was one, as it was.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# How much of an object is read or written at a time when it moves between a local file and
# the lake (and hashed, for LocalLake). 1 MiB makes per-block costs (a syscall, a Python loop
# turn) negligible next to copying the bytes, while a multi-GB object moves in a few MiB.
BLOCK_BYTES = 1024 * 1024


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


def read_blocks(handle: BinaryIO, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """The rest of ``handle``'s content, ``block_bytes`` at a time (the last block shorter)."""
    while block := handle.read(block_bytes):
        yield block


@contextmanager
def replacing_file(destination: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A file to write ``destination``'s new content into: a temporary sibling that, when the
    block ends without an error, is fsynced and renamed over ``destination`` (``os.replace`` is
    atomic within a directory), and otherwise deleted. So ``destination`` is either untouched
    or complete, also after a power cut. The temporary file is created like ``open(..., "wb")``
    would create ``destination`` (mode from the umask), and the parent directory must exist.
    """
    target = Path(destination)
    # The name stays within NAME_MAX whatever the destination is called.
    temporary = target.with_name(f".{target.name[:64]}.{uuid.uuid4().hex}.part")
    try:
        with temporary.open("xb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
