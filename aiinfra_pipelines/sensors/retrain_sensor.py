"""``retraining_sensor``: enough new accepted badcases (or drift) start a training cycle.

The run key is derived from *what* triggers the retraining — the exact set of unseen badcase
frames, or the drift verdict's commit — so a repeated tick, a lost cursor or a restarted daemon
asks for the same key and Dagster launches nothing twice. While a training cycle is queued or
running the sensor waits: the running one already includes everything published before it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import dagster as dg
import pandas as pd

from aiinfra_pipelines.datasets.selection import (
    FRAME_KEY,
    benchmark_not_ready,
    logs_in_use,
    unseen_badcases,
)
from aiinfra_pipelines.ingest import definitions as ingest_layer
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.mining import definitions as mining_layer
from aiinfra_pipelines.operations.drift import latest_drift_verdict as read_latest_drift
from aiinfra_pipelines.runs import IN_FLIGHT, RESOURCE_TAG, TRIGGER_TAG

from .settings import RetrainingSettings

TRAINING_JOB = "training_cycle"
# The assets whose runs feed the next dataset: every asset of the ingest and mining layers.
DATA_ASSETS = frozenset(
    key
    for layer in (ingest_layer, mining_layer)
    for asset in layer.defs.assets
    for key in asset.keys
)
MINING_ASSETS = frozenset(key for asset in mining_layer.defs.assets for key in asset.keys)
PUBLISHED_INGEST = dg.AssetKey("published_ingest")
PUBLISHED_MINING = dg.AssetKey("published_mining")


@dataclass(frozen=True)
class RetrainingDecision:
    retrain: bool
    reason: str
    run_key: str = ""


def badcase_fingerprint(badcases: pd.DataFrame) -> str:
    """A stable id of a set of frames: the same frames give the same id in any order."""
    keys = sorted(f"{log}#{int(index)}" for log, index in badcases[FRAME_KEY].itertuples(False))
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def decide_retraining(
    unseen: pd.DataFrame,
    drift: dict | None,
    settings: RetrainingSettings,
    logs_in_use: frozenset[str] = frozenset(),
) -> RetrainingDecision:
    """Whether to retrain now, why, and under which run key (pure: the sensor's whole logic).

    Drift retrains only when its recent window holds logs the latest dataset has not trained
    on (nor the benchmark holds out, ``logs_in_use``): a model retrained on the very logs that
    drifted from the last dataset's sample would learn nothing new — in the demo a window of
    the newest logs, all in the dataset just trained, "drifted" from that dataset's random
    sample and started a second, identical training cycle.
    """
    threshold = settings.min_unseen_badcases
    if len(unseen) >= threshold:
        return RetrainingDecision(
            True,
            f"{len(unseen)} unseen accepted badcases (threshold {threshold})",
            f"retrain-badcases-{badcase_fingerprint(unseen)}",
        )
    if settings.on_drift and drift and drift.get("drifted"):
        recent = set((drift.get("identity") or {}).get("recent_logs") or [])
        if recent and recent <= logs_in_use:
            return RetrainingDecision(
                False,
                f"{len(unseen)} unseen accepted badcases, below {threshold}; input drift "
                f"({', '.join(drift.get('signals', []))}) in {len(recent)} recent log(s) the "
                "latest dataset already trains on or the benchmark holds out: nothing new to "
                "retrain on",
            )
        return RetrainingDecision(
            True,
            f"input drift detected ({', '.join(drift.get('signals', [])) or 'see drift_monitor'})",
            f"retrain-drift-{drift['id']}",
        )
    return RetrainingDecision(
        False, f"{len(unseen)} unseen accepted badcases, below {threshold}; no drift"
    )


def plan_retraining(lake: VersionedLake) -> RetrainingDecision:
    """The sensor's decision on the lake as it is (also what the demo waits on).

    Enough badcases are not enough while the benchmark is empty: a candidate could not be
    evaluated, so the run would fail at ``offline_eval``; the sensor waits for more drives.
    """
    drift = latest_drift_verdict(lake)
    decision = decide_retraining(
        unseen_badcases(lake),
        drift,
        RetrainingSettings.load(),
        logs_in_use(lake) if drift and drift.get("drifted") else frozenset(),
    )
    if decision.retrain:
        waiting = benchmark_not_ready(lake)
        if waiting is not None:
            return RetrainingDecision(False, f"{decision.reason}, but {waiting}")
    return decision


def data_runs_in_flight(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """Queued or running runs that ingest or mine logs (they feed the next dataset)."""
    return [
        run
        for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT))
        if run.asset_selection and run.asset_selection & DATA_ASSETS
    ]


def batches_awaiting_mining(instance: dg.DagsterInstance) -> list[str]:
    """Published upload batches whose mining has not run yet (or is still to be retried).

    Between a batch's ingest run ending and the automation sensor launching its mining run no
    data run is in flight, yet a dataset cut then would miss that batch's badcases. A batch
    whose mining failed for good is not waited on: the failure sensor reports it, and the loop
    goes on.
    """
    unmined = instance.get_materialized_partitions(PUBLISHED_INGEST) - (
        instance.get_materialized_partitions(PUBLISHED_MINING)
    )
    waiting = []
    for partition in sorted(unmined):
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": partition}))
        mining = [r for r in runs if r.asset_selection and r.asset_selection & MINING_ASSETS]
        failed_for_good = bool(mining) and (
            mining[0].status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
            and mining[0].tags.get("dagster/will_retry") != "true"
        )
        if not failed_for_good:
            waiting.append(partition)
    return waiting


def latest_drift_verdict(lake: VersionedLake) -> dict | None:
    """The newest drift_monitor verdict on main, if the operations layer has published one."""
    return read_latest_drift(lake)


@dg.sensor(
    name="retraining_sensor",
    job_name=TRAINING_JOB,
    minimum_interval_seconds=RetrainingSettings.load().interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Starts a training cycle when enough unseen accepted badcases (or drift) exist.",
)
def retraining_sensor(
    context: dg.SensorEvaluationContext, lake: VersionedLake
) -> dg.SensorResult | dg.SkipReason:
    in_flight = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=TRAINING_JOB, statuses=IN_FLIGHT), limit=1
    )
    if in_flight:
        return dg.SkipReason(f"training cycle {in_flight[0].run_id} is still in flight")
    feeding = data_runs_in_flight(context.instance)
    if feeding:
        # Logs are being ingested or mined right now: a dataset cut now would miss them.
        return dg.SkipReason(f"{len(feeding)} ingest/mining run(s) still in flight")
    unmined = batches_awaiting_mining(context.instance)
    if unmined:
        return dg.SkipReason(f"{len(unmined)} published batch(es) not mined yet, e.g. {unmined[0]}")
    decision = plan_retraining(lake)
    if not decision.retrain:
        return dg.SkipReason(decision.reason)
    context.log.info(f"requesting {TRAINING_JOB}: {decision.reason}")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=decision.run_key,
                tags={TRIGGER_TAG: decision.reason[:200], RESOURCE_TAG: "gpu"},
            )
        ],
        cursor=decision.run_key,
    )
