"""Child process for the kill-and-resume test: trains until it pauses, then the test kills it.

Run as ``python -m aiinfra_pipelines_tests.training._resume_worker <job.json>``. The first
training step of epoch ``pause_after_epochs`` (0-based: after that many epochs completed and
checkpointed) does not run: the child writes ``paused_marker`` and waits for the SIGKILL. So
the kill lands after exactly that many epochs, however fast or loaded the machine is (the
only difference from the parent's runs; the step it stops in changes nothing it saved).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pandas as pd

from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.train import train_perception_model


def _pause_at(epoch: int, marker: Path) -> None:
    original = PerceptionModule.training_step

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        if self.current_epoch >= epoch:
            written = marker.with_name(marker.name + ".tmp")
            written.write_text(str(self.current_epoch))
            written.replace(marker)  # whole or absent: the parent kills as soon as it appears
            threading.Event().wait()  # until the parent's SIGKILL
        return original(self, batch, batch_idx)

    PerceptionModule.training_step = training_step  # type: ignore[method-assign]


def main(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    _pause_at(int(job["pause_after_epochs"]), Path(job["paused_marker"]))
    train_perception_model(
        pd.read_pickle(job["train"]),
        pd.read_pickle(job["val"]),
        checkpoint_dir=Path(job["checkpoint_dir"]),
        mlflow_tracking_uri=job["tracking_uri"],
        experiment=job["experiment"],
        run_tags=job["run_tags"],
        params=job["params"],
        config=job["config"],
        max_epochs=int(job["max_epochs"]),
        seed=int(job["seed"]),
    )


if __name__ == "__main__":
    main(sys.argv[1])
