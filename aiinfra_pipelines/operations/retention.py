"""Lineage-aware retention: which raw uploads have expired, and what still needs them.

Why here and not in ``curation`` (where DESIGN lists retention): whether raw data may go
depends on lineage that later layers write — dataset manifests (datasets), the scenario
library (simulation) and certificates (release) — and a module may only import earlier layers.
``operations`` comes after all of them, so retention lives here.

Raw drive logs land on ``ingest-<batch>`` branches and are never merged (they carry PII);
``main`` receives only anonymized frames whose rows name the ingest commit that landed them
(``source_commit``). So a raw upload commit is needed exactly when some dataset, benchmark,
scenario or certificate names it (``retention_lineage``). The plan lists two kinds of expiry
candidate:

* ``ingest_branch``: a whole branch; its age is that of its newest upload commit (retention's
  own commits do not make a branch young again). Its upload commits are the ones reachable
  from its head that are not on ``main``.
* ``quarantined_upload``: a rejected raw log (a quarantine record on ``main``) still on a
  branch that is kept; its age is the time it was quarantined.

A candidate older than ``max_age_days`` is planned for deletion only when nothing protected
depends on it, everything uploaded to it has been taken in (each drive-log commit has a batch
record on ``main``; telemetry, the branch's published telemetry records), and the lineage
could be read completely. A certified engine's lineage is never deletable.
Planning deletes nothing: ``retention_apply`` does, with an approval.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

from aiinfra_pipelines.ingest.batch import batch_record_key
from aiinfra_pipelines.ingest.discovery import commit_log_keys
from aiinfra_pipelines.ingest.partitions import BatchRef, LogLocation
from aiinfra_pipelines.ingest.views import quarantine_view
from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import CommitInfo, VersionedLake

from .retention_lineage import Dependent, RawLineage, read_raw_lineage
from .retention_settings import INGEST_BRANCH, QUARANTINED_UPLOAD, RetentionSettings
from .telemetry import TelemetrySettings
from .telemetry_batch import telemetry_records_key

DELETE = "delete"
KEEP = "keep"
# Commit metadata that marks retention's own commits on an ingest branch.
RETENTION_COMMIT_KIND = "retention"
SECONDS_PER_DAY = 86400.0
# Commits read per step of the walk back from a branch head (grows until main is reached).
FIRST_WALK_COMMITS = 8


@dataclass(frozen=True)
class Candidate:
    """Raw data that may expire: a branch, or one quarantined upload on a branch.

    ``ref`` pins what was judged (the branch head; the upload's landing commit) so deleting can
    refuse when it moved; ``commits`` are the raw upload commits it holds.
    """

    kind: str
    name: str
    branch: str
    key: str
    ref: str
    created_at: datetime
    commits: frozenset[str]
    log_id: str = ""
    not_ingested: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanRow:
    kind: str
    name: str
    age_days: float
    action: str
    reason: str
    dependents: list[str]
    ref: str
    branch: str
    key: str


@dataclass
class RetentionPlan:
    """Every candidate with its verdict; ``digest`` identifies the decision, not the clock."""

    as_of: str
    max_age_days: float
    rows: list[PlanRow]
    problems: list[str] = field(default_factory=list)

    @property
    def deletions(self) -> list[PlanRow]:
        return [row for row in self.rows if row.action == DELETE]

    @property
    def digest(self) -> str:
        decided = [
            [r.kind, r.name, r.ref, r.action, sorted(r.dependents)]
            for r in sorted(self.rows, key=lambda r: (r.kind, r.name))
        ]
        return hashlib.sha256(json.dumps(decided).encode()).hexdigest()

    def to_record(self) -> dict[str, object]:
        return {
            "as_of": self.as_of,
            "max_age_days": self.max_age_days,
            "digest": self.digest,
            "problems": list(self.problems),
            "rows": [asdict(row) for row in self.rows],
        }


# ----------------------------------------------------------------------------- candidates
def _is_retention_commit(commit: CommitInfo) -> bool:
    return commit.metadata.get("kind") == RETENTION_COMMIT_KIND


def upload_commits(lake: VersionedLake, head: str, main_commits: set[str]) -> list[CommitInfo]:
    """The commits a branch added on top of ``main``, newest first.

    Ingest branches fork from ``main`` and are never merged, so walking back from the head
    until the first commit that ``main`` also has gives exactly the branch's own commits. The
    walk reads a few commits at a time (a branch holds a handful; ``main``'s history is long).
    """
    limit = FIRST_WALK_COMMITS
    while True:
        walked = lake.log(head, limit=limit)
        own = list(itertools.takewhile(lambda commit: commit.id not in main_commits, walked))
        if len(own) < len(walked) or len(walked) < limit:
            return own
        limit *= 4


def _adds_under(lake: VersionedLake, commit: CommitInfo, prefix: str) -> bool:
    if not commit.parents:
        return bool(lake.list_objects(commit.id, prefix=prefix))
    changes = lake.diff(commit.parents[0], commit.id, prefix=prefix)
    return any(change.type != "removed" for change in changes)


def _not_ingested(
    lake: VersionedLake, branch: str, commits: list[CommitInfo], telemetry_prefix: str
) -> tuple[str, ...]:
    """Upload commits whose data the loop has not taken in yet: drive logs without a batch
    record on ``main``, telemetry while the branch's telemetry is not published."""
    uploads = [commit for commit in commits if not _is_retention_commit(commit)]
    pending = [
        commit.id
        for commit in uploads
        if commit_log_keys(lake, commit)
        and not lake.object_exists(MAIN_BRANCH, batch_record_key(BatchRef(branch, commit.id)))
    ]
    if not lake.object_exists(MAIN_BRANCH, telemetry_records_key(branch)):
        pending += [c.id for c in uploads if _adds_under(lake, c, telemetry_prefix)]
    return tuple(dict.fromkeys(pending))


def branch_candidates(lake: VersionedLake) -> list[Candidate]:
    """Every ``ingest-<batch>`` branch, aged by its newest upload commit."""
    main_commits = {commit.id for commit in lake.log(MAIN_BRANCH)}
    telemetry_prefix = TelemetrySettings.load().upload_prefix
    found = []
    for branch in lake.list_branches(prefix=INGEST_BRANCH_PREFIX):
        own = upload_commits(lake, branch.head, main_commits)
        uploads = [commit for commit in own if not _is_retention_commit(commit)]
        newest = uploads[0] if uploads else lake.log(branch.head, limit=1)[0]
        found.append(
            Candidate(
                kind=INGEST_BRANCH,
                name=branch.name,
                branch=branch.name,
                key="",
                ref=branch.head,
                created_at=newest.created_at,
                commits=frozenset(commit.id for commit in uploads),
                not_ingested=_not_ingested(lake, branch.name, own, telemetry_prefix),
            )
        )
    return found


def quarantined_candidates(lake: VersionedLake) -> list[Candidate]:
    """Quarantined raw logs still on their ingest branch, aged by when they were quarantined."""
    records = quarantine_view(lake)
    found = []
    for record in records.to_dict(orient="records"):
        location = LogLocation(str(record["source_branch"]), str(record["log_key"]))
        if not lake.branch_exists(location.branch) or not lake.object_exists(
            location.branch, location.key
        ):
            continue  # already gone
        found.append(
            Candidate(
                kind=QUARANTINED_UPLOAD,
                name=location.name,
                branch=location.branch,
                key=location.key,
                ref=str(record["source_commit"]),
                created_at=pd.Timestamp(record["quarantined_at"]).to_pydatetime(),
                commits=frozenset({str(record["source_commit"])}),
                log_id=location.log_name,
            )
        )
    return found


# -------------------------------------------------------------------------------- verdicts
def dependents_of(candidate: Candidate, lineage: RawLineage) -> list[Dependent]:
    """What was built from ``candidate``: any of its commits (a branch), or its very log."""
    if candidate.kind == QUARANTINED_UPLOAD:
        return lineage.on_log(candidate.ref, candidate.log_id)
    return lineage.on_commits(candidate.commits)


def age_days(candidate: Candidate, now: datetime) -> float:
    return (now - candidate.created_at).total_seconds() / SECONDS_PER_DAY


def _labels(dependents: list[Dependent]) -> str:
    return ", ".join(d.label for d in dependents)


def verdict(
    candidate: Candidate, lineage: RawLineage, settings: RetentionSettings, now: datetime
) -> tuple[str, str, list[Dependent]]:
    """(action, reason, dependents) for one candidate; the first rule that keeps it wins."""
    dependents = dependents_of(candidate, lineage)
    certified = [d for d in dependents if d.certified]
    protected = [d for d in dependents if d.kind in settings.protect]
    age = age_days(candidate, now)
    if certified:
        return KEEP, f"lineage of a certified engine: {_labels(certified)}", dependents
    if protected:
        return KEEP, f"depended on by {_labels(protected)}", dependents
    if candidate.kind not in settings.expire:
        return KEEP, f"{candidate.kind} is not configured to expire", dependents
    if age < settings.max_age_days:
        return KEEP, f"younger than {settings.max_age_days:g} days", dependents
    if candidate.not_ingested:
        pending = ", ".join(commit[:12] for commit in candidate.not_ingested)
        return KEEP, f"upload commit(s) not ingested yet: {pending}", dependents
    if lineage.problems:
        return KEEP, f"lineage incomplete: {'; '.join(lineage.problems)}", dependents
    reason = f"older than {settings.max_age_days:g} days and nothing protected depends on it"
    if dependents:
        reason += f" (unprotected dependents: {_labels(dependents)})"
    return DELETE, reason, dependents


def _row(
    candidate: Candidate, lineage: RawLineage, settings: RetentionSettings, now: datetime
) -> PlanRow:
    action, reason, dependents = verdict(candidate, lineage, settings, now)
    return PlanRow(
        kind=candidate.kind,
        name=candidate.name,
        age_days=round(age_days(candidate, now), 3),
        action=action,
        reason=reason,
        dependents=sorted(d.label for d in dependents),
        ref=candidate.ref,
        branch=candidate.branch,
        key=candidate.key,
    )


def plan_retention(
    lake: VersionedLake,
    now: datetime,
    settings: RetentionSettings | None = None,
    lineage: RawLineage | None = None,
) -> RetentionPlan:
    """The retention plan as of ``now`` (an aware datetime: the clock is injected).

    A quarantined upload on a branch that is itself deleted goes with it and gets no row.
    """
    if now.tzinfo is None:
        raise ValueError(f"retention needs an aware 'now' (UTC), got naive {now.isoformat()}")
    settings = settings or RetentionSettings.load()
    lineage = lineage if lineage is not None else read_raw_lineage(lake)
    rows = [_row(candidate, lineage, settings, now) for candidate in branch_candidates(lake)]
    deleted_branches = {row.branch for row in rows if row.action == DELETE}
    rows += [
        _row(candidate, lineage, settings, now)
        for candidate in quarantined_candidates(lake)
        if candidate.branch not in deleted_branches
    ]
    return RetentionPlan(now.isoformat(), settings.max_age_days, rows, list(lineage.problems))


def render_plan(plan: RetentionPlan, console: Any) -> None:
    """Rich output for ``aiinfra retention``: deletions first, then what is kept and why."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        "kind",
        "name",
        "age (days)",
        "action",
        "reason",
        "dependents",
        title=f"retention plan {plan.digest[:16]} as of {plan.as_of} "
        f"(max age {plan.max_age_days:g} days; a dry run: nothing deleted)",
    )
    for row in sorted(plan.rows, key=lambda r: (r.action != DELETE, r.kind, r.name)):
        action = f"[bold red]{row.action}[/]" if row.action == DELETE else row.action
        table.add_row(
            row.kind,
            escape(row.name),
            f"{row.age_days:.1f}",
            action,
            escape(row.reason),
            escape(", ".join(row.dependents)),
        )
    console.print(table)
    console.print(
        f"{len(plan.deletions)} to delete, {len(plan.rows) - len(plan.deletions)} kept. Delete "
        "by materializing the retention asset with dry_run: false and approved_by."
    )
