"""A car's uploader process for the kill tests: drains an outbox and SIGKILLs itself at a
given point of the upload (a power cut), as ``python -m`` with JSON arguments.

Kill points: ``part``/``completed`` are the outbox's own progress events (after a part is
recorded; after the lake joined a log, before the outbox records it); ``acknowledged`` is right
after the lake stored a part, before the outbox could record it; ``commit`` is just before the
drain's commit, after every upload completed and was recorded."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.vehicle.outbox import Outbox
from aiinfra_pipelines.vehicle.outbox_settings import OutboxSettings


class _DyingLake(LocalLake):
    """The real LocalLake; the power is cut at the lake-side kill points."""

    def __init__(self, *args, progress, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress

    def upload_part(self, upload, part_number, data):
        etag = super().upload_part(upload, part_number, data)
        self._progress("acknowledged", upload.key, part_number)
        return etag

    def commit(self, branch, *args, **kwargs):
        self._progress("commit", branch, 0)
        return super().commit(branch, *args, **kwargs)


def main() -> None:
    args = json.loads(sys.argv[1])
    kill_at = (args["kill_event"], args["kill_after"])
    seen = {"part": 0, "completed": 0, "acknowledged": 0, "commit": 0}

    def progress(event: str, log_id: str, number: int) -> None:
        seen[event] += 1
        if (event, seen[event]) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    lake = _DyingLake(
        root=args["lake_root"], upload_min_part_bytes=args["min_part_bytes"], progress=progress
    )
    outbox = Outbox(Path(args["folder"]), OutboxSettings.load(args["config"]))

    outbox.drain(lake, args["branch"], window_open=True, on_progress=progress)


if __name__ == "__main__":
    main()
