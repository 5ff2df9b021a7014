"""Audit records: what a blocking check saw, kept on the run branch beside what it audited.

Dagster's blocking checks gate the steps of one run, but an operator can re-execute just the
publish step of a failed run. So the publish step does not trust the run graph: it requires a
passing audit record for every check it depends on, whose checksum still matches the audited
object. The records merge into ``main`` with the data — an audit trail for every publish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .encoding import json_document
from .errors import LakeError
from .port import VersionedLake
from .publish import commit_changes, ensure_run_branch, run_branch_name

AUDIT_PREFIX = "audits/"


class AuditMissingError(LakeError):
    """Publishing was refused: an audit did not pass (or never ran) for the data to publish."""


@dataclass(frozen=True)
class RequiredAudit:
    asset: str
    check: str
    audited_key: str  # the lake key of the object the check audited


def audit_key(asset: str, check: str, partition: str | None) -> str:
    return f"{AUDIT_PREFIX}{asset}/{check}/{partition or '__all__'}.json"


def record_audit(
    lake: VersionedLake,
    root_run_id: str,
    *,
    asset: str,
    check: str,
    partition: str | None,
    audited_key: str,
    passed: bool,
    dagster_run_id: str,
) -> None:
    branch = ensure_run_branch(lake, root_run_id)
    checksum = lake.stat_object(branch, audited_key).checksum
    record = json_document(
        {
            "asset": asset,
            "check": check,
            "partition": partition or "",
            "audited_key": audited_key,
            "checksum": checksum,
            "passed": passed,
            "dagster_run_id": dagster_run_id,
        }
    )
    commit_changes(
        lake,
        branch,
        f"audit {check} on {asset}" + (f" [{partition}]" if partition else "") + f": {passed}",
        {"kind": "audit", "check": check, "passed": str(passed).lower()},
        puts={audit_key(asset, check, partition): record},
        allow_empty=False,
    )


def verify_audits(
    lake: VersionedLake,
    root_run_id: str,
    required: Sequence[RequiredAudit],
    partition: str | None,
) -> None:
    """Raise :class:`AuditMissingError` naming every audit that is missing, failed or stale."""
    branch = run_branch_name(root_run_id)
    problems = []
    for audit in required:
        key = audit_key(audit.asset, audit.check, partition)
        if not lake.object_exists(branch, key):
            problems.append(f"{audit.check}: never ran on this run's data")
            continue
        record = lake.get_json(branch, key)
        if not record["passed"]:
            problems.append(f"{audit.check}: failed")
        elif lake.stat_object(branch, audit.audited_key).checksum != record["checksum"]:
            problems.append(f"{audit.check}: {audit.audited_key} changed after it was audited")
    if problems:
        raise AuditMissingError("refusing to publish to main: " + "; ".join(problems))
