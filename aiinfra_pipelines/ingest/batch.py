"""Ingesting one upload batch: every log validated, anonymized and indexed on a worker pool.

Each log gets its own verdict — ``accepted``, ``quarantined`` (with every reason),
``duplicate`` (the same SHA-256 content was ingested before, under any key) or
``already_ingested`` (this very batch published it before: a re-run) — and one bad log never
fails its batch. Workers write each accepted log's frames table straight to the run branch, so
the pixels never travel back to the run's process; what returns is the log's verdict and its
scene-index rows. The run's process then stages the quarantine records, the content ledger and
the batch record beside them; the publish step merges all of it into ``main`` at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from aiinfra_pipelines.lake.io_manager import DATA_PREFIX, parquet_bytes
from aiinfra_pipelines.lake.layout import INDEX_RECORD_SUFFIX, PULL_NOTICE_SUFFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.parallel import PoolSettings, map_in_pool, worker_state

from .index_records import ingest_index_record, read_pull_notice
from .partitions import BatchRef, LogLocation
from .pulls import answered
from .quarantine import quarantine_key, quarantine_record
from .streaming import StreamingSettings, file_sha256
from .tables import scene_index_table, trigger_rule_names, write_frames_parquet
from .verdicts import ACCEPTED, ALREADY_INGESTED, DUPLICATE, NOTICE, QUARANTINED

CONTENT_PREFIX = "ingest/content/"
BATCH_RECORD_PREFIX = "ingest/batches/"

VERDICT_COLUMNS = (
    "log_key",
    "log_id",
    "source_branch",
    "source_commit",
    "sha256",
    "size_bytes",
    "verdict",
    "reason_codes",
    "reasons",
    "duplicate_of",
    "frames",
    "duration_s",
    "frame_rate_hz",
    "slice",
    "frames_object",
)


def content_key(sha256: str) -> str:
    """Where the content ledger records the first ingestion of one file content."""
    return f"{CONTENT_PREFIX}{sha256[:2]}/{sha256}.json"


def batch_record_key(batch: BatchRef) -> str:
    return f"{BATCH_RECORD_PREFIX}{batch.branch}/{batch.commit}.json"


def frames_object_key(batch: BatchRef, location: LogLocation) -> str:
    """One Parquet object per accepted log: a batch's pixels are never one object in memory."""
    return f"{DATA_PREFIX}/anonymized_frames/{batch.partition_key}/{location.stem}.parquet"


@dataclass(frozen=True)
class LogJob:
    """What a worker needs to ingest one log (small and picklable)."""

    batch: BatchRef
    key: str
    main_ref: str  # main pinned at the start of the run: the content ledger it checks
    run_branch: str
    revalidate_quarantined: bool = False  # an operator fixed a rule: judge rejected logs again


@dataclass
class LogOutcome:
    """One log's verdict and, when accepted, its scene-index rows (no pixels)."""

    location: LogLocation
    source_commit: str
    sha256: str
    size_bytes: int
    verdict: str
    reasons: list[tuple[str, str]] = field(default_factory=list)
    duplicate_of: str = ""
    log_id: str = ""
    frames: int = 0
    duration_s: float = 0.0
    frame_rate_hz: float = 0.0
    slice: str = ""
    frames_object: str = ""
    frames_checksum: str = ""
    index: pd.DataFrame | None = None
    # What was uploaded: an MCAP log, a held log's index record, or a pull notice.
    kind: str = "log"
    notice: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        return {
            "log_key": self.location.key,
            "log_id": self.log_id or self.location.log_name,
            "source_branch": self.location.branch,
            "source_commit": self.source_commit,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "verdict": self.verdict,
            "reason_codes": ",".join(code for code, _ in self.reasons),
            "reasons": json.dumps([{"code": c, "message": m} for c, m in self.reasons]),
            "duplicate_of": self.duplicate_of,
            "frames": self.frames,
            "duration_s": round(self.duration_s, 3),
            "frame_rate_hz": round(self.frame_rate_hz, 3),
            "slice": self.slice,
            "frames_object": self.frames_object,
        }


def ingest_log(job: LogJob) -> LogOutcome:
    """Validate, anonymize and index one log (runs in a worker; see :func:`ingest_batch`).

    The log streams through the worker: downloaded to a scratch file (never read whole),
    validated with payloads left in the file, anonymized and written to the frames Parquet
    one row group at a time, and uploaded from the scratch file, so a worker's memory does not
    grow with the log's length (``benchmarks/large_log.py`` measures it).
    """
    settings = StreamingSettings.load()
    with settings.scratch() as scratch:
        return _ingest_log(job, Path(scratch), settings)


def _ingest_log(job: LogJob, scratch: Path, settings: StreamingSettings) -> LogOutcome:
    lake: VersionedLake = worker_state()["lake"]
    location = LogLocation(job.batch.branch, job.key)
    raw_path = scratch / "upload"
    lake.download_object(job.batch.commit, job.key, raw_path)
    sha256 = file_sha256(raw_path)
    outcome = LogOutcome(location, job.batch.commit, sha256, raw_path.stat().st_size, ACCEPTED)
    earlier = lake.get_json_or_none(job.main_ref, content_key(sha256))
    if earlier is not None and not (
        job.revalidate_quarantined and earlier.get("verdict") == QUARANTINED
    ):
        same_batch = earlier.get("partition") == job.batch.partition_key
        outcome.verdict = ALREADY_INGESTED if same_batch else DUPLICATE
        outcome.duplicate_of = f"{earlier.get('source_branch')}/{earlier.get('log_key')}"
        return outcome
    if job.key.endswith(INDEX_RECORD_SUFFIX):
        data = raw_path.read_bytes()  # a JSON record of a segment a car keeps: kilobytes
        return ingest_index_record(outcome, data, worker_state()["anonymization_key"])
    if job.key.endswith(PULL_NOTICE_SUFFIX):
        return read_pull_notice(outcome, raw_path.read_bytes())
    report = validate_drive_log(raw_path, streaming=True)
    outcome.frames = int(report.frame_count)
    outcome.duration_s = float(report.duration_s)
    outcome.frame_rate_hz = float(report.frame_rate_hz or 0.0)
    if not report.accepted or report.log is None:
        outcome.verdict = QUARANTINED
        outcome.reasons = [(reason.code, reason.message) for reason in report.reasons]
        return outcome
    anonymous = anonymize_log(report.log, worker_state()["anonymization_key"])
    frames_path = scratch / "frames.parquet"
    signals = write_frames_parquet(anonymous, frames_path, settings.frames_per_row_group)
    outcome.frames_object = frames_object_key(job.batch, location)
    outcome.frames_checksum = lake.upload_file(
        job.run_branch, outcome.frames_object, frames_path
    ).checksum
    tags = {k: v for k, v in report.metadata.items() if k != "vin"}
    tags["vehicle_pseudonym"] = anonymous.metadata["vehicle_pseudonym"]
    tags["calibration_sha256"] = report.calibration_sha256
    outcome.index = scene_index_table(
        signals,
        tags=tags,
        events=[(event.timestamp_ns, event.rule) for event in anonymous.events],
        rule_names=trigger_rule_names(),
        source_branch=location.branch,
        source_commit=job.batch.commit,
        log_key=location.key,
        frames_object=outcome.frames_object,
        log_sha256=sha256,
    )
    outcome.log_id = anonymous.log_id
    outcome.slice = str(outcome.index["slice"].iloc[0]) if len(outcome.index) else ""
    return outcome


@dataclass
class BatchResult:
    """A worked batch: every log's outcome, in key order, and what it staged."""

    batch: BatchRef
    outcomes: list[LogOutcome]

    def by_verdict(self, verdict: str) -> list[LogOutcome]:
        return [o for o in self.outcomes if o.verdict == verdict]

    @property
    def accepted(self) -> list[LogOutcome]:
        return self.by_verdict(ACCEPTED)

    def verdicts(self) -> pd.DataFrame:
        return pd.DataFrame([o.row() for o in self.outcomes], columns=list(VERDICT_COLUMNS))

    def scene_index(self) -> pd.DataFrame:
        parts = [o.index for o in self.accepted if o.index is not None and len(o.index)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def frames_manifest(self) -> dict[str, Any]:
        """The ``anonymized_frames`` value: one frames object (and its checksum) per log."""
        return {
            "partition": self.batch.partition_key,
            "logs": [
                {
                    "log_id": o.log_id,
                    "log_key": o.location.key,
                    "frames_object": o.frames_object,
                    "checksum": o.frames_checksum,
                    "frames": o.frames,
                }
                for o in self.accepted
                if o.frames_object  # an index record has no frames: its raw log is on a car
            ],
            "frames": sum(o.frames for o in self.accepted if o.frames_object),
        }

    def counts(self) -> dict[str, int]:
        return {
            verdict: len(self.by_verdict(verdict))
            for verdict in (ACCEPTED, QUARANTINED, DUPLICATE, ALREADY_INGESTED, NOTICE)
        }


def _mark_in_batch_duplicates(
    lake: VersionedLake, batch: BatchRef, keys: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """Keys to work, and ``{key: first key}`` for keys whose content another key repeats.

    The lake's checksum identifies content within one lake, so this costs a stat per log and
    no read; the content ledger (SHA-256) catches repeats across batches.
    """
    first: dict[str, str] = {}
    repeats: dict[str, str] = {}
    for key in sorted(keys):
        checksum = lake.stat_object(batch.commit, key).checksum
        if checksum in first:
            repeats[key] = first[checksum]
        else:
            first[checksum] = key
    return [k for k in sorted(keys) if k not in repeats], repeats


def ingest_batch(
    lake: VersionedLake,
    batch: BatchRef,
    keys: Sequence[str],
    *,
    run_branch: str,
    main_ref: str,
    anonymization_key: bytes,
    pool: PoolSettings,
    on_log: Callable[[int, int, LogOutcome], None] | None = None,
    revalidate_quarantined: bool = False,
) -> BatchResult:
    """Work every log of ``batch`` on the pool; returns the outcomes (nothing staged but frames).

    ``on_log(done, total, outcome)`` is called as each log finishes, for progress.
    ``revalidate_quarantined`` judges logs the ledger records as quarantined again (after an
    operator fixed a rule that was too strict); every other log keeps its recorded verdict.
    """
    work, repeats = _mark_in_batch_duplicates(lake, batch, keys)
    jobs = [LogJob(batch, key, main_ref, run_branch, revalidate_quarantined) for key in work]
    state = {"lake": lake, "anonymization_key": anonymization_key}
    outcomes: dict[str, LogOutcome] = {}
    for done, outcome in enumerate(map_in_pool(ingest_log, jobs, state, pool), start=1):
        outcomes[outcome.location.key] = outcome
        if on_log:
            on_log(done, len(jobs), outcome)
    for key, first in repeats.items():
        original = outcomes[first]
        outcomes[key] = LogOutcome(
            LogLocation(batch.branch, key),
            batch.commit,
            original.sha256,
            original.size_bytes,
            DUPLICATE,
            duplicate_of=original.location.name,
        )
    return BatchResult(batch, [outcomes[key] for key in sorted(outcomes)])


def stage_batch_records(
    lake: VersionedLake, result: BatchResult, run_branch: str, main_ref: str, dagster_run_id: str
) -> None:
    """Stage quarantine records, the content ledger and the batch record on the run branch.

    Accepted and quarantined contents both enter the ledger: the same bytes landed again are a
    duplicate either way. An accepted log lifts an earlier quarantine record of the same key (a
    fixed re-upload).
    """
    for outcome in result.outcomes:
        if outcome.verdict == QUARANTINED:
            record = quarantine_record(
                outcome.location,
                source_commit=outcome.source_commit,
                checksum=outcome.sha256,
                reasons=outcome.reasons,
                dagster_run_id=dagster_run_id,
            )
            lake.put_object(run_branch, quarantine_key(outcome.location), parquet_bytes(record))
        if outcome.verdict == ACCEPTED and lake.object_exists(
            main_ref, quarantine_key(outcome.location)
        ):
            lake.delete_object(run_branch, quarantine_key(outcome.location))
        if outcome.verdict in (ACCEPTED, QUARANTINED):
            lake.put_json(
                run_branch,
                content_key(outcome.sha256),
                {
                    "sha256": outcome.sha256,
                    "partition": result.batch.partition_key,
                    "source_branch": outcome.location.branch,
                    "log_key": outcome.location.key,
                    "verdict": outcome.verdict,
                },
            )
    for key, body in pull_answers(lake, result, main_ref).items():
        lake.put_object(run_branch, key, body)
    lake.put_json(
        run_branch,
        batch_record_key(result.batch),
        {"partition": result.batch.partition_key, **result.counts()},
    )


def pull_answers(lake: VersionedLake, result: BatchResult, main_ref: str) -> dict[str, bytes]:
    """The pull requests this batch answers: raw logs that arrived (or were quarantined),
    notices of evicted ones."""
    logs = [o for o in result.outcomes if o.kind == "log"]
    # A raw log already in the lake (a duplicate) serves its pull as well as a new one.
    served = {
        o.log_id or o.location.log_name: {
            "partition": result.batch.partition_key,
            "log_key": o.location.key,
            "sha256": o.sha256,
            **({"duplicate_of": o.duplicate_of} if o.duplicate_of else {}),
        }
        for o in logs
        if o.verdict in (ACCEPTED, DUPLICATE, ALREADY_INGESTED)
    }
    refused = {
        o.log_id or o.location.log_name: ",".join(code for code, _ in o.reasons)
        for o in logs
        if o.verdict == QUARANTINED
    }
    unservable = {o.log_id: o.notice for o in result.by_verdict(NOTICE) if o.notice is not None}
    return answered(lake, main_ref, served=served, unservable=unservable, refused=refused)
