"""``lakefs_ingest_sensor``: each upload batch landed on an ingest branch becomes one run."""

import dagster as dg

from aiinfra_pipelines.environment import load_environment
from aiinfra_pipelines.ingest.assets import GROUP
from aiinfra_pipelines.ingest.discovery import discover_new_batches, dump_cursor, parse_cursor
from aiinfra_pipelines.ingest.partitions import ingest_batch_partitions
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.runs import GROUP_TAG, LOG_COUNT_TAG, SOURCE_COMMIT_TAG

INGEST_SELECTION = dg.AssetSelection.groups(GROUP)


@dg.sensor(
    name="lakefs_ingest_sensor",
    target=INGEST_SELECTION,
    minimum_interval_seconds=int(load_environment()["sensors"]["ingest_interval_s"]),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches ingest branches; one run per landed upload batch (diff-based cursor).",
)
def lakefs_ingest_sensor(
    context: dg.SensorEvaluationContext, lake: VersionedLake
) -> dg.SensorResult:
    skipped: list[str] = []
    batches, next_cursor = discover_new_batches(lake, parse_cursor(context.cursor), skipped)
    for problem in skipped:
        context.log.warning(f"skipped an upload the lake cannot address: {problem}")
    if batches:
        logs = sum(len(batch.keys) for batch in batches)
        context.log.info(f"{len(batches)} new batch(es), {logs} drive log(s)")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=batch.run_key,
                partition_key=batch.partition_key,
                tags={
                    SOURCE_COMMIT_TAG: batch.ref.commit,
                    LOG_COUNT_TAG: str(len(batch.keys)),
                    GROUP_TAG: GROUP,
                },
            )
            for batch in batches
        ],
        dynamic_partitions_requests=(
            [ingest_batch_partitions.build_add_request([b.partition_key for b in batches])]
            if batches
            else []
        ),
        cursor=dump_cursor(next_cursor),
    )
