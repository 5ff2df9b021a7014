"""Landing synthetic drive logs and materializing one ingest batch, as tests need them."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from aiinfra_pipelines.fleet.landing import LandedBatch, land_batch
from aiinfra_pipelines.ingest.checks import ingest_checks
from aiinfra_pipelines.ingest.definitions import defs as ingest_defs
from aiinfra_pipelines.ingest.partitions import BatchRef, ingest_batch_partitions
from aiinfra_pipelines.logs.writer import encode_drive_log

INGEST_ASSETS = list(ingest_defs.assets or [])


def land(lake, batch_id: str, logs: Sequence[tuple[str, object]]) -> LandedBatch:
    """Land ``(log_id, DriveLog | bytes)`` pairs as one upload commit."""
    payloads = [
        (log_id, log if isinstance(log, bytes) else encode_drive_log(log)) for log_id, log in logs
    ]
    return land_batch(lake, batch_id, payloads)


def materialize_partition(
    instance: dg.DagsterInstance,
    resources: dict,
    partition_key: str,
    raise_on_error: bool = True,
    run_config: dict | None = None,
) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions(ingest_batch_partitions.name, [partition_key])
    return dg.materialize(
        [*INGEST_ASSETS, *ingest_checks()],
        instance=instance,
        resources=resources,
        partition_key=partition_key,
        raise_on_error=raise_on_error,
        run_config=run_config,
    )


def partition_of(batch: LandedBatch) -> str:
    """The ingest partition of one landed upload batch (its branch and commit)."""
    return BatchRef(batch.branch, batch.commit).partition_key


def verdicts_of(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """``{log key: verdict}`` from a batch run's ``validated_drive_logs`` output."""
    table = result.output_for_node("ingest_batch", "validated_drive_logs")
    return dict(zip(table["log_key"], table["verdict"], strict=True))
