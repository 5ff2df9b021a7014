"""Killing a child process at a chosen moment, and retrying a killed Dagster run as the daemon
would: shared by the tests that prove work survives a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest


def kill_when_paused(child: subprocess.Popen, marker: Path, log: Path, hang_guard_s: float) -> None:
    """SIGKILL the child's process group as soon as it pauses (it writes ``marker`` and waits
    to be killed); fail with its log if it exits first or never pauses. The group goes either
    way, so no worker outlives a failed test."""
    hang_guard = time.monotonic() + hang_guard_s
    try:
        while not marker.is_file():
            if child.poll() is not None:
                exited = f"child exited ({child.returncode}) before the kill"
                pytest.fail(f"{exited}:\n{log.read_text()}")
            if time.monotonic() > hang_guard:
                pytest.fail(f"the child never paused:\n{log.read_text()}")
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)


def retry_from_failure(
    instance: dg.DagsterInstance, killed: dg.DagsterRun, get_job: Callable[[], dg.JobDefinition]
) -> dg.ExecuteInProcessResult:
    """What the run monitor and the daemon's run retries do to a run that died in flight: mark
    it failed, then re-execute it from the failure with the parent's tags."""
    instance.report_run_failed(killed)
    return dg.execute_job(
        dg.reconstructable(get_job),
        instance,
        tags=killed.tags,
        reexecution_options=dg.ReexecutionOptions.from_failure(killed.run_id, instance),
    )
