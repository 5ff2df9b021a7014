"""A publish step for any group: merge the run's lake branch into ``main`` as an asset.

Putting the merge in an asset of its own (downstream of the group's outputs and behind their
blocking checks) makes write–audit–publish visible in the asset graph: if an audit fails, this
step is skipped and ``main`` does not move.
"""

from collections.abc import Callable, Sequence

import dagster as dg

from .audits import RequiredAudit, verify_audits
from .layout import MAIN_BRANCH
from .port import VersionedLake
from .publish import (
    find_publish,
    publish_run_branch,
    root_run_id_of,
    run_branch_name,
)


def build_publish_asset(
    name: str,
    *,
    group: str,
    deps: Sequence[dg.AssetsDefinition | dg.AssetKey | str],
    partitions_def: dg.PartitionsDefinition | None = None,
    automation_condition: dg.AutomationCondition | None = None,
    required_audits: Callable[[str | None], list[RequiredAudit]] | None = None,
) -> dg.AssetsDefinition:
    """``required_audits(partition)`` names the checks whose passing records must be present."""

    @dg.asset(
        name=name,
        group_name=group,
        deps=list(deps),
        partitions_def=partitions_def,
        kinds={"lakefs"},
        automation_condition=automation_condition,
        description=f"Merges the run branch with the `{group}` outputs into main once audited.",
    )
    def _publish(context: dg.AssetExecutionContext, lake: VersionedLake) -> dg.MaterializeResult:
        partition = context.partition_key if context.has_partition_key else ""
        root = root_run_id_of(context.run)
        if required_audits is not None:
            verify_audits(lake, root, required_audits(partition or None), partition or None)
        elif not lake.branch_exists(run_branch_name(root)) and find_publish(lake, root) is None:
            # Automation can request the publish step alone (its upstream ran and published in
            # another run). This run wrote nothing, so there is nothing to merge: say so rather
            # than fail. With required audits this cannot happen: they would be missing.
            context.log.info(f"run {root} wrote nothing to publish; main is unchanged")
            return dg.MaterializeResult(
                metadata={"main_commit": lake.resolve_ref(MAIN_BRANCH), "published": False}
            )
        merge_commit = publish_run_branch(
            lake,
            root,
            f"publish {group}" + (f" {partition}" if partition else ""),
            {"kind": group, "dagster_run_id": context.run.run_id, "partition": partition},
        )
        return dg.MaterializeResult(
            metadata={
                "main_commit": merge_commit,
                "lake_ref": f"lakefs://{lake.repository}/{merge_commit}",
                "published": True,
            }
        )

    return _publish
