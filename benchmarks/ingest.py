"""Ingestion throughput by upload batch, and sensor-tick cost; prints figures, asserts nothing.

1. One upload batch of ``--logs`` logs × ``--frames`` frames, three ways over the same files in
   one run, each in frames/s and as a ratio to the bare read:
   - ``bare``: a bare ``mcap`` read of every record (the floor: no decoding, one process);
   - ``logic``: the ingest logic on the worker pool — ``ingest_batch`` over the landed batch on
     a LocalLake (read, SHA-256, validate, anonymize, frames + index tables, Parquet, staged);
   - ``dagster``: the full Dagster path — ``lakefs_ingest_sensor`` ticks, then the batch run
     executes in a fresh process (``dagster asset materialize`` on the code location, as a
     launched run would: start-up, every step, the blocking PII and GX checks, the merge) until
     the batch is published on ``main``.
   ``run_startup_s`` is the time from launching that run's process to its first step starting.
2. ``lakefs_ingest_sensor`` tick time with 10 vs 1,000 prior commits on one ingest branch.
3. Decode cost of the recording rig: the same simulated-fleet drive (``--rig-vehicles`` x
   ``--rig-episodes``) encoded twice — fleet-6's layout (raw front camera only) and fleet.yaml's
   rig (JPEG front + rear cameras, LiDAR point clouds, calibration) — through the per-log
   ingest logic in one process (validate, anonymize, frames + index tables), in frames/s:
   ``per_log_fps_front_raw`` vs ``per_log_fps_rig_jpeg_lidar`` (and on the worker pool,
   ``logic_fps_front_raw`` vs ``logic_fps_rig_jpeg_lidar``).

    .venv/bin/python benchmarks/ingest.py [--logs 200] [--frames 50] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import dagster as dg
from mcap.reader import make_reader

from aiinfra_pipelines.fleet.landing import land_batch
from aiinfra_pipelines.fleet.settings import with_overrides
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.ingest.batch import ingest_batch
from aiinfra_pipelines.ingest.discovery import dump_cursor
from aiinfra_pipelines.ingest.partitions import BatchRef
from aiinfra_pipelines.ingest.tables import frames_table, scene_index_table
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.parallel import PoolSettings
from aiinfra_pipelines.sensors.ingest_sensor import lakefs_ingest_sensor

PROJECT = Path(__file__).resolve().parent.parent


def bare_read(files: list[bytes]) -> int:
    records = 0
    for data in files:
        for _schema, _channel, _message in make_reader(io.BytesIO(data)).iter_messages():
            records += 1
    return records


def logic_path(files: list[bytes], workdir: Path, pool: PoolSettings) -> tuple[int, float]:
    """Frames accepted and seconds for ``ingest_batch`` on the pool over one landed batch."""
    lake = LocalLake(root=str(workdir / "logic-lake"))
    landed = land_batch(lake, "logic", [(f"log{i:04d}", data) for i, data in enumerate(files)])
    run_branch = "run-benchmark"
    lake.create_branch(run_branch, source_ref=MAIN_BRANCH)
    started = time.perf_counter()
    result = ingest_batch(
        lake,
        BatchRef(landed.branch, landed.commit),
        landed.keys,
        run_branch=run_branch,
        main_ref=lake.resolve_ref(MAIN_BRANCH),
        anonymization_key=b"k" * 32,
        pool=pool,
    )
    seconds = time.perf_counter() - started
    return sum(o.frames for o in result.accepted), seconds


def _first_step_start(instance: dg.DagsterInstance, run_id: str) -> float:
    records = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)
    return min(record.timestamp for record in records)


def dagster_path(files: list[bytes], workdir: Path) -> dict[str, float]:
    """Sensor tick → one batch run in a fresh process → published on main; seconds of each."""
    home = workdir / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "AIINFRA_ENV": "local"}
    os.environ["DAGSTER_HOME"] = str(home)  # the instance below and the run share it
    lake = LocalLake(root=str(home / "lake"))
    started = time.perf_counter()
    land_batch(lake, "bench", [(f"log{i:04d}", data) for i, data in enumerate(files)])
    landed_s = time.perf_counter() - started
    with dg.DagsterInstance.get() as instance:
        tick_started = time.perf_counter()
        context = dg.build_sensor_context(instance=instance, resources={"lake": lake})
        result = lakefs_ingest_sensor(context)
        (request,) = result.run_requests
        for add in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(add.partitions_def_name, list(add.partition_keys))
        tick_s = time.perf_counter() - tick_started
        launched_wall = time.time()
        launched = time.perf_counter()
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "dagster",
                "asset",
                "materialize",
                "-m",
                "aiinfra_pipelines.definitions",
                "--select",
                "group:ingest",
                "--partition",
                request.partition_key,
            ],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
        )
        run_s = time.perf_counter() - launched
        if completed.returncode != 0:
            raise RuntimeError(f"the batch run failed:\n{completed.stderr[-3000:]}")
        (run,) = instance.get_runs(limit=1)
        startup_s = _first_step_start(instance, run.run_id) - launched_wall
    main_merge = lake.log(MAIN_BRANCH, limit=1)[0]
    if main_merge.metadata.get("partition") != request.partition_key:
        raise RuntimeError("the batch was not published on main")
    return {
        "seconds": tick_s + run_s,
        "tick_s": tick_s,
        "run_s": run_s,
        "run_startup_s": startup_s,
        "landing_s": landed_s,
        "logs_accepted": float(main_merge.metadata.get("logs_accepted", "0")),
    }


def sensor_tick_seconds(prior_commits: int, workdir: Path, repeats: int = 5) -> float:
    lake = LocalLake(root=str(workdir / f"lake-{prior_commits}"))
    lake.ensure_repository()
    branch = "ingest-bench"
    lake.create_branch(branch)
    payload = b"x" * 1024
    for i in range(prior_commits):
        lake.put_object(branch, f"logs/prior-{i:05d}.mcap", payload)
        lake.commit(branch, f"prior {i}")
    timings = []
    (workdir / f"home-{prior_commits}").mkdir()
    with dg.instance_for_test(temp_dir=str(workdir / f"home-{prior_commits}")) as instance:
        for repeat in range(repeats):
            cursor = dump_cursor({branch: lake.resolve_ref(branch)})
            lake.put_object(branch, f"logs/new-{repeat}.mcap", payload)
            lake.commit(branch, f"new {repeat}")
            context = dg.build_sensor_context(
                instance=instance, cursor=cursor, resources={"lake": lake}
            )
            started = time.perf_counter()
            result = lakefs_ingest_sensor(context)
            timings.append(time.perf_counter() - started)
            assert len(result.run_requests) == 1
    return statistics.median(timings)


def front_only(log: DriveLog) -> DriveLog:
    """The same drive as fleet-6 recorded it: raw front camera, no rear camera, no LiDAR."""
    frames = [dataclasses.replace(f, rear_image=None, lidar_points=None) for f in log.frames]
    metadata = {**log.metadata, "sensor_config_version": "cam-front-160x64-v2"}
    return dataclasses.replace(log, metadata=metadata, frames=frames, recording=None)


def per_log_fps(files: list[bytes]) -> float:
    """Frames/s of one process running the per-log ingest logic (no lake, no pool)."""
    frames = 0
    started = time.perf_counter()
    for data in files:
        report = validate_drive_log(data)
        if not report.accepted or report.log is None:
            raise RuntimeError(f"benchmark log refused: {report.codes}")
        table = frames_table(anonymize_log(report.log, b"k" * 32))
        scene_index_table(
            table,
            tags=dict(report.metadata),
            events=[],
            rule_names=[],
            source_branch="b",
            source_commit="c",
            log_key="k",
            frames_object="o",
        )
        frames += len(table)
    return frames / (time.perf_counter() - started)


def rig_decode_cost(vehicles: int, episodes: int, workdir: Path, pool: PoolSettings) -> dict:
    """Frames/s of the ingest logic on one drive, fleet-6 layout vs the JPEG + LiDAR rig."""
    config = with_overrides(None, {"drive_workers": {"count": 1}})
    logs = drive_fleet(vehicles, episodes, seed=0, config=config)
    rig = [encode_drive_log(log) for log in logs]
    front = [encode_drive_log(front_only(log)) for log in logs]
    frames = sum(len(log.frames) for log in logs)
    figures: dict[str, float] = {"rig_frames": frames}
    for name, files in (("front_raw", front), ("rig_jpeg_lidar", rig)):
        per_log_fps(files[:1])  # warm the decoders and the config cache
        figures[f"per_log_fps_{name}"] = round(per_log_fps(files), 1)
        accepted, seconds = logic_path(files, workdir / name, pool)
        figures[f"logic_fps_{name}"] = round(accepted / seconds, 1)
        figures[f"mcap_bytes_per_frame_{name}"] = round(sum(map(len, files)) / frames)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=200)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--skip-dagster", action="store_true")
    parser.add_argument("--rig-vehicles", type=int, default=4)
    parser.add_argument("--rig-episodes", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    say = (lambda *_: None) if args.json else print

    files = [
        encode_drive_log(
            make_synthetic_log(n_frames=args.frames, seed=i, image_height=64, image_width=160)
        )
        for i in range(args.logs)
    ]
    megabytes = sum(map(len, files)) / 1e6
    total_frames = args.logs * args.frames
    pool = PoolSettings.load("ingest.yaml")
    say(f"{args.logs} logs, {total_frames} frames, {megabytes:.1f} MB of MCAP, one batch")

    started = time.perf_counter()
    records = bare_read(files)
    bare_s = time.perf_counter() - started
    bare_fps = total_frames / bare_s
    say(f"bare mcap read       : {bare_fps:9.0f} frames/s ({records} records, {bare_s:.2f} s)")
    figures: dict[str, object] = {
        "logs": args.logs,
        "frames": total_frames,
        "megabytes": round(megabytes, 1),
        "workers": pool.workers,
        "bare_fps": round(bare_fps, 1),
    }

    with tempfile.TemporaryDirectory() as tmp:
        frames, logic_s = logic_path(files, Path(tmp), pool)
        logic_fps = frames / logic_s
        figures |= {"logic_fps": round(logic_fps, 1), "logic_ratio": round(logic_fps / bare_fps, 3)}
        say(
            f"ingest logic, {pool.workers} workers: {logic_fps:9.0f} frames/s "
            f"({logic_fps / bare_fps:.2f}x bare, {logic_s:.2f} s)"
        )
        if not args.skip_dagster:
            dagster = dagster_path(files, Path(tmp))
            dagster_fps = total_frames / dagster["seconds"]
            figures |= {
                "dagster_fps": round(dagster_fps, 1),
                "dagster_ratio": round(dagster_fps / bare_fps, 3),
                "run_startup_s": round(dagster["run_startup_s"], 2),
                "dagster_s": round(dagster["seconds"], 2),
                "sensor_tick_s": round(dagster["tick_s"], 3),
            }
            say(
                f"full dagster path    : {dagster_fps:9.0f} frames/s "
                f"({dagster_fps / bare_fps:.2f}x bare, {dagster['seconds']:.2f} s: sensor tick "
                f"{dagster['tick_s']:.2f} s, run {dagster['run_s']:.2f} s of which start-up "
                f"{dagster['run_startup_s']:.2f} s)"
            )
        rig = rig_decode_cost(args.rig_vehicles, args.rig_episodes, Path(tmp), pool)
        figures |= rig
        say(
            f"per-log ingest logic, {rig['rig_frames']:.0f} fleet frames, one process: "
            f"{rig['per_log_fps_front_raw']:.0f} frames/s fleet-6 layout (raw front camera) vs "
            f"{rig['per_log_fps_rig_jpeg_lidar']:.0f} frames/s JPEG front + rear + LiDAR; "
            f"on the pool {rig['logic_fps_front_raw']:.0f} vs {rig['logic_fps_rig_jpeg_lidar']:.0f}"
        )
        for prior in (10, 1000):
            tick = sensor_tick_seconds(prior, Path(tmp))
            figures[f"sensor_tick_ms_{prior}_commits"] = round(tick * 1e3, 1)
            say(f"sensor tick, {prior:5d} prior commits: {tick * 1e3:7.1f} ms (median)")
    if args.json:
        print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
