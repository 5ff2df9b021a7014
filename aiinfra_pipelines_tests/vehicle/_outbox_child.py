"""A car's uploader process for the kill tests: drains an outbox and SIGKILLs itself at a
given point of the upload (a power cut), as ``python -m`` with JSON arguments."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.vehicle.outbox import Outbox
from aiinfra_pipelines.vehicle.outbox_settings import OutboxSettings


def main() -> None:
    args = json.loads(sys.argv[1])
    lake = LocalLake(root=args["lake_root"], upload_min_part_bytes=args["min_part_bytes"])
    outbox = Outbox(Path(args["folder"]), OutboxSettings.load(args["config"]))
    kill_at = (args["kill_event"], args["kill_after"])
    seen = {"part": 0, "completed": 0}

    def progress(event: str, log_id: str, number: int) -> None:
        seen[event] += 1
        if (event, seen[event]) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    outbox.drain(lake, args["branch"], window_open=True, on_progress=progress)


if __name__ == "__main__":
    main()
