"""A code location for the Postgres-restart test: one sensor, one asset that logs while it waits.

The sensor requests one run per ``request-<key>`` file in the folder named by ``WATCH_ENV``
(run key = ``<key>``, every tick: only Dagster's run-key bookkeeping keeps a key from running
twice). The asset touches ``started-<key>``, then writes a log event to the instance every
0.2 s until the test touches ``release-<key>`` — so the run is writing to Postgres while the
test restarts it.
"""

import os
import time
from pathlib import Path

import dagster as dg

WATCH_ENV = "AIINFRA_TEST_WATCH_DIR"
RUN_KEY_TAG = "dagster/run_key"
MAX_WAIT_S = 300


def _watch() -> Path:
    return Path(os.environ[WATCH_ENV])


@dg.asset
def waiting_step(context: dg.AssetExecutionContext) -> str:
    key = context.run.tags[RUN_KEY_TAG]
    (_watch() / f"started-{key}").touch()
    deadline = time.monotonic() + MAX_WAIT_S
    while not (_watch() / f"release-{key}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"release-{key} never appeared")
        context.log.info(f"run key {key} waiting")
        time.sleep(0.2)
    return key


waiting_job = dg.define_asset_job("waiting_job", selection=[waiting_step])


@dg.sensor(
    job=waiting_job, minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING
)
def request_sensor(context: dg.SensorEvaluationContext):
    for path in sorted(_watch().glob("request-*")):
        yield dg.RunRequest(run_key=path.name.removeprefix("request-"))


defs = dg.Definitions(assets=[waiting_step], jobs=[waiting_job], sensors=[request_sensor])
