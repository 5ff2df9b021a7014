"""Ingestion assets (group ``ingest``), one dynamic partition per landed drive log.

drive_logs → validated_drive_logs → anonymized_frames → scene_index → published_ingest.
Every step writes on the run's lake branch; ``published_ingest`` merges it into ``main`` only
after the blocking checks (no PII, Great Expectations suites) passed. A rejected log stops at
validation: its quarantine record is published, its downstream steps are skipped, and the other
logs of its batch — separate partitions, separate runs — are untouched.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.lake.audits import RequiredAudit, verify_audits
from aiinfra_pipelines.lake.io_manager import asset_object_base
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import (
    ensure_run_branch,
    publish_run_branch,
    root_run_id_of,
    run_branch_name,
)
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.validation import validate_drive_log

from .expectations import suite_names
from .partitions import LogLocation, drive_log_partitions
from .quarantine import quarantine_key, quarantine_record, write_quarantine_record
from .resources import AnonymizationKey
from .tables import frames_table, scene_index_table, trigger_rule_names

GROUP = "ingest"
SOURCE_COMMIT_TAG = "aiinfra/source_commit"
RETRY = dg.RetryPolicy(
    max_retries=3, delay=1, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.FULL
)


def root_run_id(context: dg.AssetExecutionContext) -> str:
    """The run id whose lake branch this run (or retry of it) writes on."""
    return root_run_id_of(context.run)


def audited_object_key(asset: str, partition: str) -> str:
    """The lake object an ingest check audits: the asset's Parquet output for the partition."""
    return asset_object_base(dg.AssetKey(asset), partition) + ".parquet"


def derived_objects(lake: VersionedLake, ref: str, partition: str) -> list[str]:
    """Every object the ingest assets derived from one log that exists at ``ref``."""
    keys = []
    for asset in ("drive_logs", "validated_drive_logs", "anonymized_frames", "scene_index"):
        base = asset_object_base(dg.AssetKey(asset), partition)
        keys += [base + ext for ext in (".parquet", ".json") if lake.object_exists(ref, base + ext)]
    return keys


def required_audits(partition: str) -> list[RequiredAudit]:
    """Every blocking check that must have passed before a partition may reach ``main``."""
    checks = [("anonymized_frames", "anonymized_frames_have_no_pii")]
    checks += [("scene_index", f"gx_{name}") for name in suite_names("scene_index")]
    return [RequiredAudit(a, c, audited_object_key(a, partition)) for a, c in checks]


def _markdown_reasons(reasons: list[tuple[str, str]]) -> str:
    lines = ["| code | reason |", "| --- | --- |"]
    lines += [f"| `{code}` | {message.replace('|', '/')} |" for code, message in reasons]
    return "\n".join(lines)


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"mcap", "lakefs"},
    retry_policy=RETRY,
)
def drive_logs(context: dg.AssetExecutionContext, lake: VersionedLake) -> dict[str, Any]:
    """A raw drive log landed on an ingest branch, pinned to the commit it arrived in.

    The bytes stay where they landed (raw logs carry PII and never reach ``main``); this asset
    records which object at which commit the rest of the partition reads.
    """
    location = LogLocation.from_partition_key(context.partition_key)
    commit = context.run.tags.get(SOURCE_COMMIT_TAG) or lake.resolve_ref(location.branch)
    stat = lake.stat_object(commit, location.key)
    context.add_output_metadata(
        {
            "source_branch": location.branch,
            "source_commit": commit,
            "log_key": location.key,
            "size_bytes": stat.size,
            "checksum": stat.checksum,
        }
    )
    return {
        "branch": location.branch,
        "key": location.key,
        "commit": commit,
        "checksum": stat.checksum,
        "size": stat.size,
    }


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"mcap"},
    output_required=False,
    retry_policy=RETRY,
)
def validated_drive_logs(
    context: dg.AssetExecutionContext, lake: VersionedLake, drive_logs: dict[str, Any]
) -> Iterator[dg.Output[dict[str, Any]]]:
    """The log's integrity, channels, metadata, timing and signal ranges, checked.

    An accepted log materializes with its summary. A rejected one does not: its quarantine
    record (every reason) is published to ``main`` and observed on this asset, and the rest of
    the partition is skipped — a bad log can neither be merged nor block its batch.
    """
    report = validate_drive_log(lake.get_object(drive_logs["commit"], drive_logs["key"]))
    reasons = [(reason.code, reason.message) for reason in report.reasons]
    if report.accepted and report.log is not None:
        tags = {k: v for k, v in report.metadata.items() if k != "vin"}
        yield dg.Output(
            {
                **drive_logs,
                "tags": tags,
                "frame_count": int(report.frame_count),
                "duration_s": float(report.duration_s),
                "frame_rate_hz": float(report.frame_rate_hz or 0.0),
                "events": [[event.timestamp_ns, event.rule] for event in report.log.events],
            },
            metadata={
                "status": "accepted",
                "frames": int(report.frame_count),
                "duration_s": round(float(report.duration_s), 2),
                "frame_rate_hz": round(float(report.frame_rate_hz or 0.0), 2),
                "slice": f"{tags.get('lighting')}/{tags.get('weather')}/{tags.get('road_type')}",
            },
        )
        return

    location = LogLocation(branch=drive_logs["branch"], key=drive_logs["key"])
    run_root = root_run_id(context)
    branch = ensure_run_branch(lake, run_root)
    record = quarantine_record(
        location,
        source_commit=drive_logs["commit"],
        checksum=drive_logs["checksum"],
        reasons=reasons,
        dagster_run_id=context.run.run_id,
    )
    # A log re-landed bad under a key that was once accepted: its old derived data goes.
    for stale in derived_objects(lake, branch, context.partition_key):
        lake.delete_object(branch, stale)
    key = write_quarantine_record(lake, branch, record)
    merge_commit = publish_run_branch(
        lake,
        run_root,
        f"quarantine {location.partition_key}",
        {
            "kind": "quarantine",
            "source_branch": location.branch,
            "source_commit": drive_logs["commit"],
            "log_key": location.key,
            "reason_codes": ",".join(code for code, _ in reasons),
            "dagster_run_id": context.run.run_id,
        },
    )
    context.log.warning(f"quarantined {location.partition_key}: {reasons}")
    context.log_event(
        dg.AssetObservation(
            asset_key=context.asset_key,
            partition=context.partition_key,
            metadata={
                "status": "quarantined",
                "reason_codes": ",".join(code for code, _ in reasons),
                "reasons": dg.MetadataValue.md(_markdown_reasons(reasons)),
                "quarantine_record": f"lakefs://{lake.repository}/main/{key}",
                "main_commit": merge_commit,
            },
        )
    )


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"pandas", "parquet"},
    retry_policy=RETRY,
)
def anonymized_frames(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    anonymization: AnonymizationKey,
    validated_drive_logs: dict[str, Any],
) -> pd.DataFrame:
    """Frames with PII removed: VIN → keyed HMAC pseudonym, GPS coarsened, plates blurred."""
    raw = read_drive_log(
        lake.get_object(validated_drive_logs["commit"], validated_drive_logs["key"])
    )
    anonymous = anonymize_log(raw, anonymization.key())
    table = frames_table(anonymous)
    plates = sum(1 for frame in raw.frames for other in frame.others if other.plate_box)
    context.add_output_metadata(
        {
            "frames": len(table),
            "vehicle_pseudonym": anonymous.metadata["vehicle_pseudonym"],
            "plates_blurred": plates,
        }
    )
    return table


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"pandas", "parquet"},
    retry_policy=RETRY,
)
def scene_index(
    context: dg.AssetExecutionContext,
    anonymized_frames: pd.DataFrame,
    validated_drive_logs: dict[str, Any],
) -> pd.DataFrame:
    """One row per frame: every log tag, signals and event flags; no pixels, no PII."""
    tags = {**validated_drive_logs["tags"]}
    tags["vehicle_pseudonym"] = str(anonymized_frames["vehicle_pseudonym"].iloc[0])
    index = scene_index_table(
        anonymized_frames,
        tags=tags,
        events=[(int(ts), str(rule)) for ts, rule in validated_drive_logs["events"]],
        rule_names=trigger_rule_names(),
        source_branch=validated_drive_logs["branch"],
        source_commit=validated_drive_logs["commit"],
        log_key=validated_drive_logs["key"],
        frames_object=audited_object_key("anonymized_frames", context.partition_key),
    )
    event_columns = [column for column in index.columns if column.startswith("event_")]
    context.add_output_metadata(
        {
            "frames": len(index),
            "slice": str(index["slice"].iloc[0]),
            "events": dg.MetadataValue.json(
                {
                    column.removeprefix("event_"): int(index[column].sum())
                    for column in event_columns
                }
            ),
            "dagster/row_count": len(index),
        }
    )
    return index


@dg.asset(
    partitions_def=drive_log_partitions,
    group_name=GROUP,
    kinds={"lakefs"},
    deps=[anonymized_frames, scene_index],
    retry_policy=RETRY,
)
def published_ingest(
    context: dg.AssetExecutionContext, lake: VersionedLake, validated_drive_logs: dict[str, Any]
) -> dg.MaterializeResult:
    """Write–audit–publish: merge the run's branch into ``main`` once every audit has passed.

    Blocking checks on ``anonymized_frames`` and ``scene_index`` stand before this step, so a
    failed audit (or a run killed earlier) leaves ``main`` exactly as it was. The step also
    verifies the checks' audit records itself, so re-executing it alone cannot skip an audit.
    """
    metadata = {
        "kind": "ingest",
        "source_branch": validated_drive_logs["branch"],
        "source_commit": validated_drive_logs["commit"],
        "log_key": validated_drive_logs["key"],
        "checksum": validated_drive_logs["checksum"],
        "dagster_run_id": context.run.run_id,
        "partition": context.partition_key,
    }
    run_root = root_run_id(context)
    branch = run_branch_name(run_root)
    if not lake.branch_exists(branch):  # a retry after the merge went through: report it
        merge_commit = publish_run_branch(
            lake, run_root, f"publish {context.partition_key}", metadata
        )
        return dg.MaterializeResult(
            metadata={"main_commit": merge_commit, "already_published": True}
        )
    verify_audits(lake, run_root, required_audits(context.partition_key), context.partition_key)
    stale_quarantine = quarantine_key(LogLocation.from_partition_key(context.partition_key))
    if lake.object_exists(branch, stale_quarantine):  # a fixed re-upload of a quarantined log
        lake.delete_object(branch, stale_quarantine)
        lake.commit(
            branch, f"lift quarantine of {context.partition_key}", {"kind": "quarantine-lifted"}
        )
    merge_commit = publish_run_branch(lake, run_root, f"publish {context.partition_key}", metadata)
    return dg.MaterializeResult(
        metadata={
            "main_commit": merge_commit,
            "source_commit": validated_drive_logs["commit"],
            "lake_ref": f"lakefs://{lake.repository}/{merge_commit}",
        }
    )
