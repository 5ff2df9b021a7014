"""The real ``dagster-daemon`` as a child process of the demo, stopped whatever happens."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from aiinfra_pipelines.config import PROJECT_ROOT, dagster_home


@dataclass
class DaemonProcess:
    """``dagster-daemon run`` on the project's workspace, logging to ``log_path``."""

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

    def require_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"dagster-daemon exited early; see {self.log_path}")

    def __exit__(self, *exc_info: object) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
