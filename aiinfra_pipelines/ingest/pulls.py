"""Pull requests: the platform asks the fleet for raw segments it holds only as index records.

One object per requested segment on ``main`` (``pulls/<log id>.json``), so a car can look up
the logs it holds and ingest can close each request as its answer arrives:

* ``open`` — requested (by an operator, or mining wanting more of a weak slice);
* ``served`` — the raw log arrived and was ingested (names the batch that brought it);
* ``closed`` — the car can no longer send it (evicted from its cache), or what it sent was
  quarantined, with that reason;
* ``expired`` — derived, never written: open longer than ingest.yaml ``pulls.max_open_days``
  (no car answered); it may be requested again.

A request is published like any other write to ``main`` (its own branch, one merge), and its
answers ride the ingest merge of the batch that carried them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from aiinfra_pipelines.config import settings_section
from aiinfra_pipelines.ingest.views import raw_available
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.errors import NotFoundError
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PULLS_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects

OPEN, SERVED, CLOSED, EXPIRED = "open", "served", "closed", "expired"


def pull_key(log_id: str) -> str:
    return f"{PULLS_PREFIX}{log_id}.json"


def max_open_days() -> float:
    return settings_section("ingest.yaml", "pulls").float("max_open_days")


def pull_requests(
    lake: VersionedLake, ref: str = MAIN_BRANCH, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Every pull request at ``ref``, oldest first; an open one past its time is ``expired``."""
    now = now or datetime.now(UTC)
    limit = timedelta(days=max_open_days())
    requests = []
    for stat in lake.list_objects(ref, prefix=PULLS_PREFIX):
        request = lake.get_json(ref, stat.key)
        opened = datetime.fromisoformat(request["requested_at"])
        if request["status"] == OPEN and now - opened > limit:
            request = {**request, "status": EXPIRED}
        requests.append(request)
    return sorted(requests, key=lambda request: (request["requested_at"], request["log_id"]))


def open_pull_requests(
    lake: VersionedLake, ref: str = MAIN_BRANCH, now: datetime | None = None
) -> dict[str, dict[str, Any]]:
    """``{log id: request}`` of the requests still waiting for a car's answer."""
    return {r["log_id"]: r for r in pull_requests(lake, ref, now) if r["status"] == OPEN}


def pull_request_counts(lake: VersionedLake, ref: str = MAIN_BRANCH) -> dict[str, int]:
    """Pull requests at ``ref`` by status (open, served, closed, expired)."""
    counts: dict[str, int] = {}
    for request in pull_requests(lake, ref):
        counts[request["status"]] = counts.get(request["status"], 0) + 1
    return counts


def requested_log_ids(lake: VersionedLake, ref: str = MAIN_BRANCH) -> set[str]:
    """Segments asked for already (served, closed or still waiting): not to be asked again.
    An expired request does not count."""
    return {r["log_id"] for r in pull_requests(lake, ref) if r["status"] != EXPIRED}


@dataclass
class PullRequestResult:
    request_id: str
    requested: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # log id → why not requested
    merge_commit: str = ""


def request_raw_segments(
    lake: VersionedLake,
    index_rows: pd.DataFrame,
    log_ids: Iterable[str],
    *,
    reason: str,
    requested_by: str,
) -> PullRequestResult:
    """Open a pull for each of ``log_ids`` that is an index-only segment without one yet.

    ``index_rows`` is the scene index with its index-only rows (``raw_available`` False);
    a log that is not among them (raw already in the lake, or unknown) is skipped, with why.
    """
    if not reason.strip():
        raise ValueError("a pull request needs a reason (what the segments are wanted for)")
    request_id = f"pull-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    result = PullRequestResult(request_id)
    index_only = _index_only_logs(index_rows)
    existing = {r["log_id"]: r for r in pull_requests(lake)}
    objects: dict[str, bytes] = {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for log_id in dict.fromkeys(log_ids):
        if log_id in existing and existing[log_id]["status"] != EXPIRED:
            result.skipped[log_id] = f"already requested ({existing[log_id]['status']})"
            continue
        if log_id not in index_only:
            result.skipped[log_id] = (
                "not an index-only segment (raw already in the lake, or unknown)"
            )
            continue
        row = index_only[log_id]
        record = {
            "log_id": log_id,
            "request_id": request_id,
            "status": OPEN,
            "requested_at": now,
            "requested_by": requested_by,
            "reason": reason,
            "slice": row["slice"],
            "vehicle_pseudonym": row["vehicle_pseudonym"],
            "index_log_key": row["log_key"],
            # What the car said it holds: the raw log that answers must be these bytes.
            "raw_sha256": _indexed_sha256(lake, row),
        }
        objects[pull_key(log_id)] = json_document(record)
        result.requested.append(log_id)
    if objects:
        result.merge_commit = publish_objects(
            lake,
            request_id,
            objects,
            f"{request_id}: pull {len(objects)} raw segment(s)",
            {"kind": "pull-request", "request_id": request_id, "requested_by": requested_by},
        )
    return result


def _indexed_sha256(lake: VersionedLake, row: Mapping[str, Any]) -> str:
    """The raw log's SHA-256 from the index record the row was indexed from ("" if unknown).

    The record stays on its ingest branch (raw zone); its commit is the row's source.
    """
    try:
        record = lake.get_json(str(row["source_commit"]), str(row["log_key"]))
    except (NotFoundError, KeyError, ValueError):
        return ""
    return str(record.get("raw_sha256") or "") if isinstance(record, dict) else ""


def _index_only_logs(index_rows: pd.DataFrame) -> dict[str, Mapping[str, Any]]:
    if index_rows.empty:
        return {}
    available = raw_available(index_rows)
    raw = set(index_rows.loc[available, "log_id"])
    rows = index_rows[~available].drop_duplicates("log_id")
    return {row["log_id"]: row for _, row in rows.iterrows() if row["log_id"] not in raw}


def answered(
    lake: VersionedLake,
    main_ref: str,
    *,
    served: Mapping[str, Mapping[str, str]],
    unservable: Mapping[str, Mapping[str, Any]],
    refused: Mapping[str, str] | None = None,
) -> dict[str, bytes]:
    """Updated request objects for the answers one ingest batch brought (to stage and merge).

    ``served``: log id → where its raw log was ingested; ``unservable``: log id → the car's
    notice; ``refused``: log id → why the raw log that arrived was quarantined (the car sent
    it and holds it no more, so the request is closed with that reason, never left open).
    Only requests still open at ``main_ref`` change; an answer without a request (a car that
    answered twice, a request withdrawn) changes nothing.
    """
    updates: dict[str, bytes] = {}
    for log_id, why in (refused or {}).items():
        request = _open_request(lake, main_ref, log_id)
        if request is not None:
            updates[pull_key(log_id)] = json_document(
                {
                    **request,
                    "status": CLOSED,
                    "answered_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "closed_reason": f"the raw log arrived and was quarantined: {why}",
                }
            )
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for log_id, where in served.items():
        request = _open_request(lake, main_ref, log_id)
        if request is None:
            continue
        expected, arrived = request.get("raw_sha256"), where.get("sha256")
        if expected and arrived and expected != arrived:
            answer = {
                "status": CLOSED,
                "closed_reason": f"the car sent other bytes than it indexed (sha256 "
                f"{arrived[:12]}, indexed {expected[:12]})",
            }
        else:
            answer = {"status": SERVED, "served_by": dict(where)}
        updates[pull_key(log_id)] = json_document({**request, **answer, "answered_at": now})
    for log_id, notice in unservable.items():
        request = _open_request(lake, main_ref, log_id)
        if request is not None:
            updates[pull_key(log_id)] = json_document(
                {
                    **request,
                    "status": CLOSED,
                    "answered_at": now,
                    "closed_reason": str(notice.get("reason") or "unservable"),
                }
            )
    return updates


def _open_request(lake: VersionedLake, ref: str, log_id: str) -> dict[str, Any] | None:
    try:
        request = lake.get_json(ref, pull_key(log_id))
    except NotFoundError:
        return None
    return request if request.get("status") == OPEN else None
