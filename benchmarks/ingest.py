"""Ingestion throughput and sensor-tick cost; prints figures, asserts nothing.

1. MCAP → scene index, MB/s and frames/s, three ways over the same files in one run:
   a bare ``mcap`` read of every record (the floor), the ingestion logic (validate, anonymize,
   frames + index tables, Parquet), and full Dagster runs of the ingest partition (materialize
   with checks and the lake publish). Ratios are against the bare read.
2. ``lakefs_ingest_sensor`` tick time with 10 vs 1,000 prior commits on the ingest branch
   (cursor at the previous head, one new commit landed), median of several ticks.

    .venv/bin/python benchmarks/ingest.py [--logs 12] [--frames 50]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import dagster as dg
from mcap.reader import make_reader

from aiinfra_pipelines.fleet.landing import land_batch
from aiinfra_pipelines.ingest.discovery import dump_cursor
from aiinfra_pipelines.ingest.partitions import LogLocation
from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.ingest.tables import frames_table, scene_index_table, trigger_rule_names
from aiinfra_pipelines.lake.io_manager import LakeIOManager
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines.sensors.ingest_sensor import lakefs_ingest_sensor


def bare_read(files: list[bytes]) -> int:
    records = 0
    for data in files:
        for _schema, _channel, _message in make_reader(io.BytesIO(data)).iter_messages():
            records += 1
    return records


def logic_path(files: list[bytes], key: bytes) -> int:
    frames = 0
    rules = trigger_rule_names()
    for data in files:
        report = validate_drive_log(data)
        anonymous = anonymize_log(read_drive_log(data), key)
        table = frames_table(anonymous)
        index = scene_index_table(
            table,
            tags={**report.metadata, "vehicle_pseudonym": anonymous.metadata["vehicle_pseudonym"]},
            events=[(e.timestamp_ns, e.rule) for e in anonymous.events],
            rule_names=rules,
            source_branch="b",
            source_commit="c",
            log_key="k",
            frames_object="o",
        )
        table.to_parquet(io.BytesIO())
        index.to_parquet(io.BytesIO())
        frames += len(index)
    return frames


def dagster_path(files: list[bytes], workdir: Path) -> int:
    from aiinfra_pipelines.ingest.checks import ingest_checks
    from aiinfra_pipelines.ingest.definitions import defs
    from aiinfra_pipelines.ingest.partitions import drive_log_partitions

    lake = LocalLake(root=str(workdir / "lake"))
    batch = land_batch(lake, "bench", [(f"log{i}", data) for i, data in enumerate(files)])
    resources = {
        "lake": lake,
        "io_manager": LakeIOManager(lake=lake),
        "anonymization": AnonymizationKey(key_hex="ab" * 32),
    }
    frames = 0
    (workdir / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(workdir / "home")) as instance:
        for key in batch.keys:
            partition = LogLocation(batch.branch, key).partition_key
            instance.add_dynamic_partitions(drive_log_partitions.name, [partition])
            result = dg.materialize(
                [*defs.assets, *ingest_checks()],
                instance=instance,
                resources=resources,
                partition_key=partition,
            )
            frames += result.output_for_node("scene_index").shape[0]
    return frames


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=12)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--skip-dagster", action="store_true")
    args = parser.parse_args()

    files = [
        encode_drive_log(
            make_synthetic_log(n_frames=args.frames, seed=i, image_height=64, image_width=160)
        )
        for i in range(args.logs)
    ]
    megabytes = sum(map(len, files)) / 1e6
    total_frames = args.logs * args.frames
    print(f"{args.logs} logs, {total_frames} frames, {megabytes:.1f} MB of MCAP")

    started = time.perf_counter()
    records = bare_read(files)
    bare_s = time.perf_counter() - started
    print(
        f"bare mcap read      : {megabytes / bare_s:8.1f} MB/s "
        f"{total_frames / bare_s:9.0f} frames/s ({records} records)"
    )

    started = time.perf_counter()
    frames = logic_path(files, b"k" * 32)
    logic_s = time.perf_counter() - started
    print(
        f"ingest logic        : {megabytes / logic_s:8.1f} MB/s {frames / logic_s:9.0f} frames/s "
        f"(bare/logic time ratio {logic_s / bare_s:.1f}x)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_dagster:
            started = time.perf_counter()
            frames = dagster_path(files, Path(tmp))
            dagster_s = time.perf_counter() - started
            print(
                f"dagster materialize : {megabytes / dagster_s:8.1f} MB/s "
                f"{frames / dagster_s:9.0f} frames/s (bare/dagster time ratio "
                f"{dagster_s / bare_s:.1f}x, {dagster_s / args.logs:.2f} s/log)"
            )
        for prior in (10, 1000):
            tick = sensor_tick_seconds(prior, Path(tmp))
            print(
                f"sensor tick, {prior:5d} prior commits: {tick * 1e3:7.1f} ms "
                "(median, 1 new commit)"
            )


if __name__ == "__main__":
    main()
