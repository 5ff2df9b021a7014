"""Child process for the kill-and-resume test: trains slowly until the test SIGKILLs it.

Run as ``python -m aiinfra_pipelines_tests.training._resume_worker <job.json>``. Each training
step is padded with a sleep (the only difference from the parent's runs) so the parent can
kill it reliably between two epochs, however fast the machine is.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd

from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.train import train_perception_model


def _slow(step_seconds: float) -> None:
    original = PerceptionModule.training_step

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        time.sleep(step_seconds)
        return original(self, batch, batch_idx)

    PerceptionModule.training_step = training_step  # type: ignore[method-assign]


def main(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    _slow(float(job["step_seconds"]))
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
