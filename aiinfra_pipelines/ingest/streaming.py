"""How an ingest worker holds a log: streamed through scratch files, a window at a time.

A 10-minute drive is gigabytes; a worker that read it whole (or its frames table) would need
memory in proportion. Workers download each log to a private scratch folder, read it with its
payloads left in the file, and write and upload the frames Parquet from scratch, one row group
at a time (ingest.yaml ``streaming``).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.lake.files import read_blocks


@dataclass(frozen=True)
class StreamingSettings:
    """ingest.yaml ``streaming``: how a worker holds a log it ingests (a window, never all)."""

    frames_per_row_group: int
    scratch_dir: str

    @classmethod
    def load(cls) -> StreamingSettings:
        section = settings_section("ingest.yaml", "streaming")
        return cls(section.int("frames_per_row_group"), section.str("scratch_dir"))

    def scratch(self) -> tempfile.TemporaryDirectory[str]:
        """A private folder for one log's files, removed with everything in it afterwards."""
        return tempfile.TemporaryDirectory(prefix="ingest-", dir=self.scratch_dir or None)


def file_sha256(path: Path) -> str:
    """SHA-256 of a scratch file, read in the lake's transfer blocks (never whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in read_blocks(handle):
            digest.update(block)
    return digest.hexdigest()
