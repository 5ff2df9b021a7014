"""A fleet's upload through its cars' outboxes: what the simulated cars do after a drive.

Each car keeps its own outbox (``<root>/<car>/``, persistent across drives, as a car's
storage is): the logs its triggers kept are queued, the low-value ones held with only their
index record queued (``vehicle.index_only``); the car answers the platform's open pull
requests; then it drains what its budget and the window allow. Every car stages on one
ingest branch and the fleet commits once, so one upload is one ingest batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.fleet.landing import LandedBatch, ingest_branch_name
from aiinfra_pipelines.ingest.pulls import open_pull_requests
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.logs.model import DriveLog

from .index_only import IndexOnlySettings, fired_rules, index_record, is_low_value
from .outbox import Outbox, commit_uploads
from .outbox_settings import OutboxSettings

EncodedLog = tuple[str, bytes, DriveLog]  # (log id, MCAP bytes, the log)
CAR_PREFIX = "car-"


def outbox_root() -> Path:
    """Where the simulated cars keep their outboxes: beside the Dagster instance."""
    return dagster_home() / "vehicles"


def car_folder(root: Path, vin: str) -> Path:
    """A car's outbox folder: named by a hash, so no VIN appears in a path."""
    return root / f"{CAR_PREFIX}{hashlib.sha256(vin.encode()).hexdigest()[:12]}"


@dataclass
class FleetOutboxUpload:
    """What the fleet sent: the batch (``None`` if nothing went up) and each car's outbox."""

    batch: LandedBatch | None
    raw_logs: int = 0
    index_only: int = 0
    pulls_served: int = 0
    pulls_unservable: int = 0
    cars: dict[str, dict[str, Any]] = field(default_factory=dict)  # car folder → status
    # This upload's own figures (a car's status counts over its whole life):
    evictions: int = 0
    bytes_sent_by_class: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # log id → why its outbox refused it


def upload_through_outboxes(
    lake: VersionedLake,
    logs: Sequence[EncodedLog],
    batch_id: str,
    *,
    root: Path | None = None,
    window_open: bool = True,
    metadata: dict[str, str] | None = None,
    extra: Sequence[tuple[str, bytes, DriveLog]] = (),
    on_car: Callable[[str, dict[str, Any]], None] | None = None,
    outbox_settings: OutboxSettings | None = None,
) -> FleetOutboxUpload:
    """Queue ``logs`` in their cars' outboxes, answer pulls, drain every car, commit once.

    ``extra`` are uploads sent as they are (never index-only): the demo's truncated copies,
    what a connection dropped mid-transfer leaves. Cars with no new log still answer pulls
    and drain their backlog. ``on_car(car, status)`` reports each car's outbox as it finishes.
    """
    root = root or outbox_root()
    settings = IndexOnlySettings.load()
    by_car: dict[Path, list[tuple[str, bytes, DriveLog, bool]]] = {}
    for log_id, data, log in logs:
        by_car.setdefault(car_folder(root, log.metadata["vin"]), []).append(
            (log_id, data, log, True)
        )
    for log_id, data, log in extra:
        by_car.setdefault(car_folder(root, log.metadata["vin"]), []).append(
            (log_id, data, log, False)
        )
    if root.is_dir():
        for folder in root.iterdir():
            if folder.is_dir() and folder.name.startswith(CAR_PREFIX):
                by_car.setdefault(folder, [])
    lake.ensure_repository()
    branch = ingest_branch_name(batch_id)
    lake.create_branch(branch, source_ref=MAIN_BRANCH, exist_ok=True)
    requests = open_pull_requests(lake)
    result = FleetOutboxUpload(batch=None)
    touched = {branch}
    try:
        for folder in sorted(by_car):
            outbox = Outbox(folder, outbox_settings)
            before = outbox.status()
            # Uploads a crashed run completed but never committed are committed below.
            touched.update(outbox.upload_branches())
            _queue(outbox, by_car[folder], settings, result)
            pulls = outbox.serve_pulls(requests)
            result.pulls_served += len(pulls.served)
            result.pulls_unservable += len(pulls.unservable)
            drained = outbox.drain(lake, branch, window_open=window_open, commit=False)
            touched.update(drained.branches)
            status = outbox.status()
            status["stopped_by"] = drained.stopped_by
            _add_this_upload(result, before, status)
            result.cars[folder.name] = status
            if on_car is not None:
                on_car(folder.name, status)
    finally:
        # Whatever the cars completed is committed, even when one car failed mid-way: an
        # uploaded item's cached bytes are gone, so its staged object must not be stranded.
        staged = sorted(entry.key for entry in lake.uncommitted(branch))
        for other in sorted(touched - {branch}):
            commit_uploads(lake, other, {"recovered_by": batch_id})
        commit = commit_uploads(lake, branch, {"batch_id": batch_id, **(metadata or {})})
    if commit is not None:
        total = sum(lake.stat_object(commit, key).size for key in staged)
        result.batch = LandedBatch(branch=branch, commit=commit, keys=staged, total_bytes=total)
    return result


def _add_this_upload(
    result: FleetOutboxUpload, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """Add what one car's outbox did during this upload (its status before and after)."""
    result.evictions += len(after["evictions"]) - len(before["evictions"])
    for name, sent in after["bytes_sent_by_class"].items():
        delta = int(sent or 0) - int(before["bytes_sent_by_class"].get(name) or 0)
        result.bytes_sent_by_class[name] = result.bytes_sent_by_class.get(name, 0) + delta


def _queue(
    outbox: Outbox,
    logs: Sequence[tuple[str, bytes, DriveLog, bool]],
    settings: IndexOnlySettings,
    result: FleetOutboxUpload,
) -> None:
    """Queue a car's new logs: low-value ones held with their index record, the rest whole.

    A log id the outbox already holds with other bytes (a re-drive after a trigger change) is
    refused by the outbox and reported, not sent: the first recording stays the one uploaded.
    """
    for log_id, data, log, may_hold in logs:
        rules = fired_rules(log)
        try:
            if may_hold and is_low_value(log, settings):
                outbox.hold(log_id, data, rules, index_record(log, data, settings))
                result.index_only += 1
            else:
                outbox.enqueue(log_id, data, rules)
                result.raw_logs += 1
        except ValueError as conflict:
            result.refused[log_id] = str(conflict)
