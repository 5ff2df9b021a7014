"""What the recording rig costs the fleet: drive time per step and bytes per frame.

Drives the same small fleet (same seed, one process) twice — fleet.yaml's rig (JPEG front and
rear cameras, LiDAR) and the fleet-6 recording (front camera only, raw) — and reports the
drive time per simulated step (best of ``--repeats``), MCAP encoding time per kept frame, and
bytes per kept frame: the front image payload raw vs JPEG, and whole MCAP files (zstd chunks)
in the fleet-6 layout, the rig recorded raw, and the rig recorded as JPEG. Prints figures,
asserts nothing.

    .venv/bin/python benchmarks/fleet_recording.py [--vehicles 4] [--episodes 2] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

from aiinfra_pipelines.fleet.settings import fleet_config, with_overrides
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.logs.message_encode import jpeg_bytes
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.writer import encode_drive_log

# fleet-6's recording: no rear camera, no LiDAR, raw front camera.
FRONT_ONLY = {
    "camera": {"encoding": "raw", "rear": {"enabled": False}},
    "lidar": {"enabled": False},
    "drive_workers": {"count": 1},
}


def drive(overrides: dict, vehicles: int, episodes: int, seed: int, repeats: int):
    """(logs, best seconds per simulated step) of one configuration."""
    config = with_overrides(None, {"drive_workers": {"count": 1}, **overrides})
    best, logs, steps = float("inf"), [], 0
    counted: list[int] = []
    for _ in range(repeats):
        counted.clear()
        started = time.perf_counter()
        logs = drive_fleet(
            vehicles,
            episodes,
            seed,
            config=config,
            on_episode=lambda d: counted.append(d.metrics.steps + 1),
        )
        best = min(best, time.perf_counter() - started)
        steps = sum(counted)
    return logs, best / steps, steps


def encoded(logs: list[DriveLog]) -> tuple[float, float]:
    """(bytes per kept frame, encode ms per kept frame)."""
    frames = sum(len(log.frames) for log in logs)
    started = time.perf_counter()
    size = sum(len(encode_drive_log(log)) for log in logs)
    return size / frames, (time.perf_counter() - started) / frames * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vehicles", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    drive_fleet(1, 1, 99, config=with_overrides(None, FRONT_ONLY))  # imports, caches

    _front_logs, front_s, steps = drive(
        FRONT_ONLY, args.vehicles, args.episodes, args.seed, args.repeats
    )
    rig_logs, rig_s, _ = drive({}, args.vehicles, args.episodes, args.seed, args.repeats)
    quality = int(fleet_config()["camera"]["jpeg_quality"])
    frames = [frame for log in rig_logs for frame in log.frames]
    front_jpeg = statistics.fmean(len(jpeg_bytes(f.image, quality)) for f in frames)
    rear_jpeg = statistics.fmean(len(jpeg_bytes(f.rear_image, quality)) for f in frames)
    legacy = [
        dataclasses.replace(
            log,
            recording=None,
            frames=[dataclasses.replace(f, rear_image=None, lidar_points=None) for f in log.frames],
        )
        for log in rig_logs
    ]
    raw_rig = [
        dataclasses.replace(log, recording=dataclasses.replace(log.recording, image_encoding="raw"))
        for log in rig_logs
    ]
    figures = {
        "steps": steps,
        "kept_frames": len(frames),
        "jpeg_quality": quality,
        "drive_ms_per_step_front_only": round(front_s * 1e3, 2),
        "drive_ms_per_step_rig": round(rig_s * 1e3, 2),
        "drive_cost_increase": round(rig_s / front_s - 1.0, 3),
        "front_image_bytes_raw": int(frames[0].image.size),
        "front_image_bytes_jpeg": round(front_jpeg),
        "rear_image_bytes_raw": int(frames[0].rear_image.size),
        "rear_image_bytes_jpeg": round(rear_jpeg),
        "lidar_points_per_frame": round(statistics.fmean(len(f.lidar_points) for f in frames), 2),
    }
    for name, logs in (("front_only_raw", legacy), ("rig_raw", raw_rig), ("rig_jpeg", rig_logs)):
        per_frame, encode_ms = encoded(logs)
        figures[f"mcap_bytes_per_frame_{name}"] = round(per_frame)
        figures[f"encode_ms_per_frame_{name}"] = round(encode_ms, 3)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        for key, value in figures.items():
            print(f"{key:34s} {value}")


if __name__ == "__main__":
    main()
