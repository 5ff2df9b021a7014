"""A real-size drive log through the real ingest path: its time and the ingest processes' peak
memory, against decoding the same log's images alone (the floor). Prints figures, asserts
nothing.

The log is ``--minutes`` of a 10 Hz car with front and rear ``--width``×``--height`` JPEG
cameras and a LiDAR, written with the stock MCAP/protobuf writers in the project's recording
layout (``resources/sources/simulated.yaml``) straight to disk, one frame at a time, so the
writer's own memory does not grow with the log. It is then landed on a LocalLake and ingested
in a child process exactly as a batch run's steps do it: ``ingest_batch`` (read, SHA-256,
validate, anonymize, frames Parquet, scene index) and the blocking PII audit
(``pii_leaks_of_log``) over what it staged.

``peak_rss_mb`` is the peak of the child's whole process tree (pool workers included), sampled
every 50 ms from ``/proc``; the child is killed when the tree passes ``--memory-cap-mb``
(``outcome: memory_cap_exceeded``; the figures then say how far it got), so a log that the
ingest path cannot hold never takes the machine down. ``decode_only_fps`` decodes both
cameras' JPEGs of every frame with the decoder ingest uses, in this process: the floor.

    .venv/bin/python benchmarks/large_log.py [--minutes 10] [--memory-cap-mb 12000] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import simplejpeg
from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
from mcap.reader import make_reader

from aiinfra_pipelines.fleet.landing import land_batch
from aiinfra_pipelines.ingest.batch import ingest_batch
from aiinfra_pipelines.ingest.checks import PiiJob, pii_leaks_of_log
from aiinfra_pipelines.ingest.partitions import BatchRef
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.model import TOPIC_CAMERA, TOPIC_REAR_CAMERA, DriveLog, Frame
from aiinfra_pipelines.logs.rig import CameraSensor, Intrinsics, Recording, StaticTransform
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import write_drive_log
from aiinfra_pipelines.parallel import PoolSettings, map_in_pool

HZ = 10
DISTINCT_IMAGES = 40  # images cycle through this many distinct renders (JPEG cost is the same)
LIDAR_POINTS = 10_000  # one sweep's returns (x, y, z float32): 120 kB
SAMPLE_S = 0.05


def _camera_image(rng: np.random.Generator, frame: Frame) -> np.ndarray:
    """A camera-like frame: the synthetic log's sky/road gradient with its plates, at the
    sensor noise of a real camera (sigma 3: about 140 kB as JPEG at quality 90, where the
    synthetic log's sigma 12 gives 900 kB)."""
    height, width = frame.image.shape[:2]
    rows = np.linspace(200, 60, height, dtype=np.float32)[:, None, None]
    image = np.clip(rows + rng.normal(0, 3, (height, width, 3)), 0, 255).astype(np.uint8)
    for other in frame.others:
        if other.plate_box is not None:
            x0, y0, x1, y1 = other.plate_box
            image[y0:y1, x0:x1] = frame.image[y0:y1, x0:x1]
    return image


class _FramesOnDemand(Sequence[Frame]):
    """A log's frames built when asked for: signals from one long thumbnail-sized synthetic log,
    pixels and LiDAR from a small pool of full-size renders. Nothing is held per frame."""

    def __init__(self, minutes: float, width: int, height: int, seed: int) -> None:
        count = round(minutes * 60 * HZ)
        self._signals = make_synthetic_log(
            count, seed=seed, image_height=8, image_width=16, plates_per_frame=0
        )
        pool = make_synthetic_log(
            DISTINCT_IMAGES, seed=seed + 1, image_height=height, image_width=width
        )
        rng = np.random.default_rng(seed)
        self._fronts = [_camera_image(rng, frame) for frame in pool.frames]
        self._rears = [np.ascontiguousarray(image[:, ::-1]) for image in self._fronts]
        self._others = [frame.others for frame in pool.frames]
        self._clouds = [
            rng.normal(0.0, 20.0, size=(LIDAR_POINTS, 3)).astype(np.float32) for _ in range(4)
        ]

    @property
    def events(self) -> list:
        return list(self._signals.events)

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self._signals.metadata)

    def __len__(self) -> int:
        return len(self._signals.frames)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index % len(self)
        k = i % DISTINCT_IMAGES
        return dataclasses.replace(
            self._signals.frames[i],
            image=self._fronts[k],
            rear_image=self._rears[k],
            lidar_points=self._clouds[i % len(self._clouds)],
            others=self._others[k],
        )

    def __iter__(self) -> Iterator[Frame]:
        return (self[i] for i in range(len(self)))


def _recording(width: int, height: int) -> Recording:
    k = (width / 2.0, 0.0, width / 2.0, 0.0, width / 2.0, height / 2.0, 0.0, 0.0, 1.0)
    cameras = {
        "front": CameraSensor("camera_front", Intrinsics(width, height, k)),
        "rear": CameraSensor("camera_rear", Intrinsics(width, height, k)),
    }
    transforms = (
        StaticTransform("base_link", "camera_front", (1.8, 0.0, 1.4), (0.5, -0.5, 0.5, -0.5)),
        StaticTransform("base_link", "camera_rear", (-0.8, 0.0, 1.4), (0.5, 0.5, -0.5, -0.5)),
        StaticTransform("base_link", "lidar", (0.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0)),
    )
    return Recording(
        sensor_config_version=f"bench-{width}x{height}-front-rear-lidar",
        image_encoding="jpeg",
        jpeg_quality=90,
        cameras=cameras,
        transforms=transforms,
    )


def write_large_log(path: Path, minutes: float, width: int, height: int, seed: int) -> int:
    """Write the log to ``path`` frame by frame; its frame count."""
    frames = _FramesOnDemand(minutes, width, height, seed)
    log = DriveLog(
        metadata=frames.metadata,
        frames=frames,  # type: ignore[arg-type]  # a Sequence the writer only iterates
        events=frames.events,
        recording=_recording(width, height),
    )
    write_drive_log(log, path)
    return len(frames)


def decode_only_fps(path: Path) -> tuple[float, int]:
    """Frames per second decoding every camera image of the log (front and rear), one process."""
    frames = 0
    started = time.perf_counter()
    with path.open("rb") as stream:
        for _schema, channel, message in make_reader(stream).iter_messages(
            topics=[TOPIC_CAMERA, TOPIC_REAR_CAMERA]
        ):
            image = CompressedImage.FromString(message.data)
            simplejpeg.decode_jpeg(image.data, colorspace="RGB")
            frames += channel.topic == TOPIC_CAMERA
    return frames / (time.perf_counter() - started), frames


# ------------------------------------------------------------------------ the ingest child
def ingest_child(lake_root: str, branch: str, commit: str, key: str) -> None:
    """Runs in the child: ``ingest_batch`` then the PII audit; one JSON line on stdout."""
    lake = LocalLake(root=lake_root)
    run_branch = "run-large-log"
    lake.create_branch(run_branch, source_ref=MAIN_BRANCH)
    pool = PoolSettings.load("ingest.yaml")
    started = time.perf_counter()
    result = ingest_batch(
        lake,
        BatchRef(branch, commit),
        [key],
        run_branch=run_branch,
        main_ref=lake.resolve_ref(MAIN_BRANCH),
        anonymization_key=b"k" * 32,
        pool=pool,
    )
    ingest_s = time.perf_counter() - started
    jobs = [
        PiiJob(commit, o.location.key, run_branch, o.frames_object, o.frames_checksum)
        for o in result.accepted
    ]
    leaks = [
        leak
        for found in map_in_pool(pii_leaks_of_log, jobs, {"lake": lake}, pool)
        for leak in found
    ]
    print(
        json.dumps(
            {
                "accepted_frames": sum(o.frames for o in result.accepted),
                "verdicts": [o.verdict for o in result.outcomes],
                "codes": [code for o in result.outcomes for code, _ in o.reasons],
                "ingest_s": round(ingest_s, 2),
                "pii_s": round(time.perf_counter() - started - ingest_s, 2),
                "pii_leaks": len(leaks),
            }
        ),
        flush=True,
    )


# ------------------------------------------------------------------------- tree memory
def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and every descendant, now."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kib(pid)
        todo += _children(pid)
    return total / 1024.0


def run_ingest(lake_root: Path, branch: str, commit: str, key: str, cap_mb: float) -> dict:
    """The ingest child, watched: its stdout JSON plus ``peak_rss_mb`` and ``outcome``."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, __file__, "--ingest-child", str(lake_root), branch, commit, key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak, outcome = 0.0, "ingested"
    while child.poll() is None:
        peak = max(peak, tree_rss_mb(child.pid))
        if peak > cap_mb:
            outcome = "memory_cap_exceeded"
            for pid in [child.pid, *_children(child.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            break
        time.sleep(SAMPLE_S)
    stdout, stderr = child.communicate()
    seconds = time.perf_counter() - started
    if outcome == "ingested" and child.returncode != 0:
        outcome = f"failed (exit {child.returncode}): {stderr.strip().splitlines()[-1:]}"
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    figures = json.loads(lines[-1]) if lines else {}
    return {**figures, "outcome": outcome, "peak_rss_mb": round(peak), "seconds": seconds}


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--ingest-child":
        ingest_child(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory-cap-mb", type=float, default=12_000, help="kill the ingest beyond this"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = parser.parse_args()
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print

    with tempfile.TemporaryDirectory(prefix="large-log-") as work:
        path = Path(work) / "large.mcap"
        started = time.perf_counter()
        frames = write_large_log(path, args.minutes, args.width, args.height, args.seed)
        megabytes = path.stat().st_size / 1e6
        say(f"wrote {frames} frames, {megabytes:.0f} MB in {time.perf_counter() - started:.0f} s")
        floor_fps, decoded = decode_only_fps(path)
        say(f"decode only: {floor_fps:.1f} frames/s over {decoded} frames (front + rear)")
        lake = LocalLake(root=str(Path(work) / "lake"))
        landed = land_batch(lake, "large", [("large-log", path.read_bytes())])
        path.unlink()
        say(f"landed on {landed.branch}; ingesting (cap {args.memory_cap_mb:.0f} MB)")
        ingest = run_ingest(
            Path(work) / "lake", landed.branch, landed.commit, landed.keys[0], args.memory_cap_mb
        )
    seconds = ingest.pop("seconds")
    result = {
        "frames": frames,
        "megabytes": round(megabytes, 1),
        "seconds": round(seconds, 1),
        "frames_per_s": round(ingest.get("accepted_frames", 0) / seconds, 1),
        "peak_rss_mb": ingest.pop("peak_rss_mb"),
        "decode_only_fps": round(floor_fps, 1),
        "minutes": args.minutes,
        "image": f"{args.width}x{args.height}",
        "memory_cap_mb": args.memory_cap_mb,
        "targets": {"peak_rss_mb": 1024, "frames_per_s": "0.5 x decode_only_fps"},
        **ingest,
    }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>18}: {value}")


if __name__ == "__main__":
    main()
