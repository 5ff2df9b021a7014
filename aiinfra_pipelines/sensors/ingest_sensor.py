"""``lakefs_ingest_sensor``: new drive logs on ingest branches become ingestion runs."""

import dagster as dg

from aiinfra_pipelines.environment import load_environment
from aiinfra_pipelines.ingest.assets import GROUP, SOURCE_COMMIT_TAG
from aiinfra_pipelines.ingest.discovery import discover_new_logs, dump_cursor, parse_cursor
from aiinfra_pipelines.ingest.partitions import drive_log_partitions
from aiinfra_pipelines.lake.port import VersionedLake

INGEST_SELECTION = dg.AssetSelection.groups(GROUP)


@dg.sensor(
    name="lakefs_ingest_sensor",
    target=INGEST_SELECTION,
    minimum_interval_seconds=int(load_environment()["sensors"]["ingest_interval_s"]),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches ingest branches; one run per newly landed drive log (diff-based cursor).",
)
def lakefs_ingest_sensor(
    context: dg.SensorEvaluationContext, lake: VersionedLake
) -> dg.SensorResult:
    skipped: list[str] = []
    landed, next_cursor = discover_new_logs(lake, parse_cursor(context.cursor), skipped)
    for problem in skipped:
        context.log.warning(f"skipped an upload the lake cannot address: {problem}")
    if landed:
        context.log.info(f"{len(landed)} new drive log(s) on {len(next_cursor)} ingest branch(es)")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=log.run_key,
                partition_key=log.partition_key,
                tags={SOURCE_COMMIT_TAG: log.commit, "aiinfra/group": GROUP},
            )
            for log in landed
        ],
        dynamic_partitions_requests=(
            [drive_log_partitions.build_add_request(sorted({log.partition_key for log in landed}))]
            if landed
            else []
        ),
        cursor=dump_cursor(next_cursor),
    )
