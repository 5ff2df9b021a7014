"""The main job: a small fleet drives, its logs land, and the Dagster daemon does the rest.

Nothing here calls an asset function directly: logs land on an ingest branch exactly as a real
uploader would put them, and the real ``dagster-daemon`` evaluates ``lakefs_ingest_sensor`` and
launches the runs through the instance's run queue. The demo only waits and reports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aiinfra_pipelines.config import PROJECT_ROOT, dagster_home
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.fleet.drive import drive_fleet_logs
from aiinfra_pipelines.fleet.landing import land_batch
from aiinfra_pipelines.ingest.assets import SOURCE_COMMIT_TAG
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.publish import MAIN_BRANCH
from aiinfra_pipelines.status import frames_by_slice

TERMINAL = {
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
}
GPU_POOL = "gpu"
TRAINING_JOB = "training_cycle"
PUBLISH_KINDS = {"ingest", "quarantine"}
PUBLISHED_MINING = dg.AssetKey("published_mining")


@dataclass
class DaemonProcess:
    """A ``dagster-daemon run`` child process, stopped on exit whatever happens."""

    log_path: Path
    process: subprocess.Popen | None = None

    def __enter__(self) -> DaemonProcess:
        executable = Path(sys.executable).with_name("dagster-daemon")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [str(executable), "run", "-w", str(PROJECT_ROOT / "workspace.yaml")],
            cwd=PROJECT_ROOT,
            env={**os.environ, "DAGSTER_HOME": str(dagster_home())},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __exit__(self, *exc_info: object) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


def corrupt_copy(data: bytes) -> bytes:
    """A truncated upload (a connection dropped mid-transfer): what quarantine is for."""
    return data[: len(data) * 2 // 3]


def latest_run_per_partition(runs: list[dg.DagsterRun]) -> dict[str, dg.DagsterRun]:
    """Run retries re-use the original's tags: keep only the newest attempt per partition."""
    latest: dict[str, dg.DagsterRun] = {}
    for run in runs:  # the instance returns newest first
        latest.setdefault(run.tags.get("dagster/partition", run.run_id), run)
    return latest


def _settled(run: dg.DagsterRun, max_retries: int) -> bool:
    """Finished for good: succeeded, or failed with no automatic retry left to come."""
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return True
    return run.status in TERMINAL and int(run.tags.get("dagster/retry_number", "0")) >= max_retries


def wait_for_runs(
    instance: dg.DagsterInstance,
    commit: str,
    expected: int,
    daemon: DaemonProcess,
    timeout_s: int,
    console: Console,
) -> list[dg.DagsterRun]:
    """Poll the instance until every partition the sensor launched for ``commit`` has settled."""
    deadline = time.monotonic() + timeout_s
    max_retries = instance.run_retries_max_retries if instance.run_retries_enabled else 0
    with console.status("waiting for the daemon's sensor and runs") as status:
        while time.monotonic() < deadline:
            runs = instance.get_runs(filters=dg.RunsFilter(tags={SOURCE_COMMIT_TAG: commit}))
            latest = latest_run_per_partition(runs)
            settled = [run for run in latest.values() if _settled(run, max_retries)]
            status.update(f"logs with runs {len(latest)}/{expected}, settled {len(settled)}")
            if len(latest) >= expected and len(settled) == len(latest):
                return list(latest.values())
            if not daemon.alive():
                raise RuntimeError(f"dagster-daemon exited early; see {daemon.log_path}")
            time.sleep(1.0)
    raise TimeoutError(f"runs for commit {commit[:12]} did not finish in {timeout_s}s")


def run_demo(
    *,
    vehicles: int,
    episodes: int,
    seed: int,
    faulty_logs: int,
    timeout_s: int,
    console: Console,
    train: bool = True,
) -> None:
    started = time.monotonic()
    instance = dg.DagsterInstance.get()
    instance.event_log_storage.set_concurrency_slots(GPU_POOL, 1)
    lake = build_lake(load_environment())
    lake.ensure_repository()

    logs = drive_fleet_logs(vehicles=vehicles, episodes=episodes, seed=seed, console=console)
    uploads = [(log_id, data) for log_id, data, _ in logs]
    uploads += [
        (f"{log_id}-truncated", corrupt_copy(data)) for log_id, data, _ in logs[:faulty_logs]
    ]
    batch_id = time.strftime("demo%Y%m%dT%H%M%S", time.gmtime()) + f"-s{seed}"
    landed = land_batch(
        lake,
        batch_id,
        uploads,
        {"vehicles": str(vehicles), "episodes": str(episodes), "seed": str(seed)},
    )
    console.print(
        f"landed {len(landed.keys)} log(s) ({landed.total_bytes / 1e6:.1f} MB) on "
        f"[cyan]{landed.branch}[/] at [green]{landed.commit[:12]}[/]"
    )

    deadline = time.monotonic() + timeout_s
    with DaemonProcess(dagster_home() / "demo" / "daemon.log") as daemon:
        runs = wait_for_runs(instance, landed.commit, len(landed.keys), daemon, timeout_s, console)
        print_summary(lake, landed.branch, runs, console)
        published = published_partitions(instance, runs)
        wait_for_mining(instance, published, daemon, deadline, console)
        print_mining_summary(lake, published, console)
        if train:
            cycle = launch_and_wait(instance, TRAINING_JOB, daemon, deadline, console)
            print_training_summary(instance, cycle, console)
    console.print(
        f"demo finished in {time.monotonic() - started:.0f}s. Open the UI with "
        f"[bold]DAGSTER_HOME={dagster_home()} .venv/bin/dagster dev -w workspace.yaml[/]"
    )


def print_summary(lake, branch: str, runs: list[dg.DagsterRun], console: Console) -> None:
    index = scene_index_view(lake)
    index = index[index["source_branch"] == branch] if not index.empty else index
    quarantine = quarantine_view(lake)
    quarantine = (
        quarantine[quarantine["source_branch"] == branch] if not quarantine.empty else quarantine
    )
    failed = [run for run in runs if run.status != dg.DagsterRunStatus.SUCCESS]
    accepted = index["log_key"].nunique() if not index.empty else 0
    console.print(
        f"[bold]logs[/] landed {len(runs)}, accepted {accepted}, quarantined {len(quarantine)}, "
        f"failed runs {len(failed)}"
    )
    table = Table("slice", "logs", "frames", title="frames indexed by slice (on main)")
    for row in frames_by_slice(index).itertuples():
        table.add_row(row.slice, str(row.logs), str(row.frames))
    console.print(table)
    for row in quarantine.itertuples():
        console.print(f"[yellow]quarantined[/] {row.log_key}: {row.reason_codes}")
    commits = Table("main commit", "kind", "message", title="latest publishes to main")
    publishes = [
        c for c in lake.log(MAIN_BRANCH, limit=200) if c.metadata.get("kind") in PUBLISH_KINDS
    ]
    for commit in publishes[:5]:
        commits.add_row(commit.id[:12], commit.metadata["kind"], escape(commit.message))
    console.print(commits)


def published_partitions(instance: dg.DagsterInstance, runs: list[dg.DagsterRun]) -> list[str]:
    """Partitions whose ingest run published to main (quarantined logs stop before that)."""
    published = instance.get_materialized_partitions(dg.AssetKey("published_ingest"))
    return sorted(p for p in (r.tags.get("dagster/partition") for r in runs) if p in published)


def wait_for_mining(
    instance: dg.DagsterInstance,
    partitions: list[str],
    daemon: DaemonProcess,
    deadline: float,
    console: Console,
) -> None:
    """The automation sensor mines each published log on its own; wait until all are mined."""
    with console.status("waiting for the automation sensor to mine the new logs") as status:
        while time.monotonic() < deadline:
            mined = instance.get_materialized_partitions(PUBLISHED_MINING) & set(partitions)
            status.update(f"logs mined {len(mined)}/{len(partitions)}")
            if len(mined) == len(partitions):
                return
            if not daemon.alive():
                raise RuntimeError(f"dagster-daemon exited early; see {daemon.log_path}")
            time.sleep(1.0)
    raise TimeoutError("mining did not finish in time")


def launch_and_wait(
    instance: dg.DagsterInstance, job: str, daemon: DaemonProcess, deadline: float, console: Console
) -> dg.DagsterRun:
    """Submit ``job`` to the instance's run queue (as an operator would) and wait for it."""
    before = {run.run_id for run in instance.get_runs(filters=dg.RunsFilter(job_name=job))}
    subprocess.run(
        [
            str(Path(sys.executable).with_name("dagster")),
            "job",
            "launch",
            "-w",
            str(PROJECT_ROOT / "workspace.yaml"),
            "-j",
            job,
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "DAGSTER_HOME": str(dagster_home())},
        check=True,
        capture_output=True,
    )
    with console.status(f"{job}: dataset → training → evaluation") as status:
        while time.monotonic() < deadline:
            new = [
                run
                for run in instance.get_runs(filters=dg.RunsFilter(job_name=job))
                if run.run_id not in before
            ]
            if new and new[0].status in TERMINAL:
                return new[0]
            status.update(f"{job}: {new[0].status.value if new else 'queued'}")
            if not daemon.alive():
                raise RuntimeError(f"dagster-daemon exited early; see {daemon.log_path}")
            time.sleep(2.0)
    raise TimeoutError(f"{job} did not finish in time")


def print_mining_summary(lake, partitions: list[str], console: Console) -> None:
    from aiinfra_pipelines.lake.io_manager import read_asset_partitions

    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    labels = read_asset_partitions(lake, "auto_labels", MAIN_BRANCH)
    reasons = (
        badcases["reasons"].str.split(",").explode().value_counts().to_dict()
        if not badcases.empty
        else {}
    )
    held_back = int(labels["held_back"].sum()) if len(labels) else 0
    console.print(
        f"[bold]mining[/] {len(partitions)} log(s): {len(badcases)} badcase frame(s) "
        f"by reason {reasons}; label QC held back {held_back}"
    )


def _metadata(instance: dg.DagsterInstance, run: dg.DagsterRun, asset: str) -> dict:
    events = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    for record in events:
        materialization = record.event_log_entry.asset_materialization
        if materialization and materialization.asset_key == dg.AssetKey(asset):
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return {}


def print_training_summary(
    instance: dg.DagsterInstance, run: dg.DagsterRun, console: Console
) -> None:
    dataset = _metadata(instance, run, "training_dataset")
    model = _metadata(instance, run, "trained_model")
    evaluation = _metadata(instance, run, "offline_eval")
    console.print(
        f"[bold]training cycle[/] {run.status.value}: dataset {dataset.get('dataset_version')} "
        f"at {str(dataset.get('dataset_commit', ''))[:12]} ({dataset.get('frames')} frames), "
        f"MLflow run {model.get('mlflow_run_id')}, {model.get('epochs')} epochs"
    )
    if "comparison" in evaluation:
        console.print(evaluation["comparison"])
    console.print(f"offline gate passed: {evaluation.get('passed')}")
