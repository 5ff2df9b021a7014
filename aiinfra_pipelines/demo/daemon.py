"""The real ``dagster-daemon`` as a supervised child process of the demo.

Like a Kubernetes deployment restarting a crashed daemon pod, the demo restarts a daemon that
died: everything the daemon does is resumable from the instance (queued runs, sensor cursors,
run keys), so a restart must lose no work and launch nothing twice — the end-to-end test kills
it mid-loop to prove exactly that. The pid of the current daemon is written beside its log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiinfra_pipelines.config import PROJECT_ROOT, dagster_home


@dataclass
class DaemonProcess:
    """``dagster-daemon run`` on the project's workspace, logging to ``log_path``.

    ``max_restarts`` bounds how often a dead daemon is started again (0: never); ``on_restart``
    is told each time, so the operator sees it.
    """

    log_path: Path
    max_restarts: int = 0
    on_restart: Callable[[str], None] | None = None
    process: subprocess.Popen | None = None
    restarts: int = field(default=0, init=False)

    @property
    def pid_path(self) -> Path:
        return self.log_path.with_suffix(".pid")

    def _start(self) -> None:
        executable = Path(sys.executable).with_name("dagster-daemon")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [str(executable), "run", "-w", str(PROJECT_ROOT / "workspace.yaml")],
            cwd=PROJECT_ROOT,
            env={**os.environ, "DAGSTER_HOME": str(dagster_home())},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid_path.write_text(str(self.process.pid))

    def __enter__(self) -> DaemonProcess:
        self._start()
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def require_alive(self) -> None:
        """Restart a daemon that died (within ``max_restarts``), else raise."""
        if self.alive():
            return
        code = self.process.returncode if self.process is not None else None
        if self.restarts >= self.max_restarts:
            raise RuntimeError(f"dagster-daemon exited ({code}); see {self.log_path}")
        self.restarts += 1
        self._log.close()
        if self.on_restart is not None:
            self.on_restart(f"dagster-daemon exited ({code}); restarting it ({self.restarts})")
        self._start()

    def __exit__(self, *exc_info: object) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
        self.pid_path.unlink(missing_ok=True)
