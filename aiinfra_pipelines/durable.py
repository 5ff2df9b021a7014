"""Files that are either whole or absent after a crash: temporary sibling, fsync, rename."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a power cut leaves the old file or the new one, never
    half of it (``os.replace`` is atomic within a filesystem; the directory is fsynced so the
    rename itself survives)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with temporary.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
