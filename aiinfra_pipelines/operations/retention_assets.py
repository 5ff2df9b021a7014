"""The ``retention`` asset (group ``operations``): the plan by default, deletion with approval.

Not automated: expiring raw data is an operator's act. A plain materialization is a dry run —
it computes the plan (``retention.plan_retention``), shows it as a table and records it on
``main``. Deleting needs ``dry_run: false`` and the approver's name in ``approved_by``; the
approval (who, when, the plan and its digest) is recorded on ``main`` before anything is
deleted, and what was deleted or skipped is added to that record afterwards. An approver who
reviewed a dry run can pin it with ``plan_digest``: the run then refuses a plan that changed.
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.layout import retention_approval_key, retention_plan_key
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.metadata_tables import table_metadata

from .retention import DELETE, RetentionPlan, plan_retention
from .retention_apply import RetentionOutcome, apply_deletions
from .retention_settings import RetentionSettings

GROUP = "operations"
# Where raw data's dependents come from (drawn as lineage in the asset graph).
LINEAGE_SOURCES = [
    "published_ingest",
    "training_dataset",
    "benchmark_set",
    "scenario_library",
    "certified_engine",
]
# A pinned plan digest may be abbreviated, but not below this many hex characters.
MIN_DIGEST_CHARS = 12


class RetentionConfig(dg.Config):
    """Launchpad options: a dry run unless an approver says otherwise."""

    dry_run: bool = Field(
        default=True, description="Only compute and record the plan; delete nothing."
    )
    approved_by: str = Field(
        default="",
        description="Who approves deleting the plan's delete rows (required when dry_run is "
        "false; recorded on main with the plan).",
    )
    plan_digest: str = Field(
        default="",
        description="Optional: the digest of the dry-run plan the approver reviewed; the run "
        "fails rather than delete when the plan it computes differs.",
    )


def _stamp(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S%fZ")


def _approval_failure(config: RetentionConfig) -> dg.Failure | None:
    if not config.dry_run and not config.approved_by.strip():
        return dg.Failure(
            description="retention deletes only with an approval: dry_run is false but "
            "approved_by is empty. Set approved_by to the approver's name (or run a dry run).",
            allow_retries=False,
        )
    return None


def _digest_failure(config: RetentionConfig, plan: RetentionPlan) -> dg.Failure | None:
    pinned = config.plan_digest.strip()
    if pinned and (len(pinned) < MIN_DIGEST_CHARS or not plan.digest.startswith(pinned)):
        return dg.Failure(
            description=f"the plan changed since it was reviewed: digest {plan.digest} does "
            f"not match the approved {pinned!r} (at least {MIN_DIGEST_CHARS} hex characters); "
            "review a new dry run",
            metadata={"plan": plan_table(plan, len(plan.rows))},
            allow_retries=False,
        )
    return None


def plan_table(plan: RetentionPlan, rows: int) -> dg.TableMetadataValue:
    """The plan's first ``rows`` rows, deletions first, as a typed Dagster table."""
    ordered = sorted(plan.rows, key=lambda r: (r.action != DELETE, r.kind, r.name))[:rows]
    columns = ("kind", "name", "age_days", "action", "reason", "dependents")
    return table_metadata(
        [
            {
                "kind": row.kind,
                "name": row.name,
                "age_days": float(row.age_days),
                "action": row.action,
                "reason": row.reason,
                "dependents": ", ".join(row.dependents),
            }
            for row in ordered
        ],
        columns=columns,
    )


def _plan_metadata(plan: RetentionPlan, settings: RetentionSettings) -> dict[str, object]:
    return {
        "plan": plan_table(plan, settings.metadata_rows),
        "plan_digest": plan.digest,
        "as_of": plan.as_of,
        "max_age_days": plan.max_age_days,
        "candidates": len(plan.rows),
        "to_delete": len(plan.deletions),
        "kept": len(plan.rows) - len(plan.deletions),
        "lineage_problems": dg.MetadataValue.json(plan.problems),
    }


def _publish(
    context: dg.AssetExecutionContext, lake: VersionedLake, key: str, record: object
) -> str:
    return publish_objects(
        lake,
        root_run_id_of(context.run),
        {key: json_document(record)},
        f"retention record {key}",
        {"kind": "retention", "dagster_run_id": context.run.run_id},
    )


def _approve_and_delete(
    context: dg.AssetExecutionContext,
    lake: VersionedLake,
    plan: RetentionPlan,
    approved_by: str,
    settings: RetentionSettings,
) -> tuple[str, RetentionOutcome]:
    """Record the approval, delete what still stands, record the outcome; the record's key."""
    now = datetime.now(UTC)
    key = retention_approval_key(_stamp(now), plan.digest)
    record: dict[str, object] = {
        "approved_by": approved_by,
        "approved_at": now.isoformat(),
        "plan_digest": plan.digest,
        "dagster_run_id": context.run.run_id,
        "plan": plan.to_record(),
        "outcome": None,
    }
    _publish(context, lake, key, record)
    outcome = apply_deletions(
        lake,
        plan.rows,
        approved_by=approved_by,
        plan_digest=plan.digest,
        now=datetime.now(UTC),
        settings=settings,
    )
    record["outcome"] = {**outcome.to_record(), "completed_at": datetime.now(UTC).isoformat()}
    _publish(context, lake, key, record)
    return key, outcome


@dg.asset(group_name=GROUP, kinds={"lakefs"}, deps=LINEAGE_SOURCES)
def retention(
    context: dg.AssetExecutionContext, config: RetentionConfig, lake: VersionedLake
) -> dg.MaterializeResult:
    """Raw ingest branches and quarantined uploads past their age that nothing depends on.

    A dry run by default: the plan (kind, name, age, action, reason, dependents) as a table,
    recorded on ``main``. With ``dry_run: false`` and ``approved_by`` it deletes the plan's
    delete rows, each re-checked against the lineage right before; a certified engine's
    lineage is never deleted.
    """
    if failure := _approval_failure(config):
        raise failure
    settings = RetentionSettings.load()
    now = datetime.now(UTC)
    plan = plan_retention(lake, now, settings)
    metadata = _plan_metadata(plan, settings)
    if config.dry_run:
        key = retention_plan_key(_stamp(now), plan.digest)
        _publish(context, lake, key, plan.to_record())
        return dg.MaterializeResult(metadata={**metadata, "dry_run": True, "record": key})
    if failure := _digest_failure(config, plan):
        raise failure
    key, outcome = _approve_and_delete(context, lake, plan, config.approved_by.strip(), settings)
    if outcome.skipped:
        context.log.warning(f"{len(outcome.skipped)} planned deletion(s) skipped on re-check")
    return dg.MaterializeResult(
        metadata={
            **metadata,
            "dry_run": False,
            "approved_by": config.approved_by.strip(),
            "record": key,
            "deleted": dg.MetadataValue.json(outcome.deleted),
            "skipped": dg.MetadataValue.json(outcome.skipped),
        }
    )
