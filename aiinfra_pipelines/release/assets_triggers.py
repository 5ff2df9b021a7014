"""``trigger_proposal`` and ``trigger_config_release`` (group ``release``): triggers to cars.

``trigger_proposal`` reads what the loop knows on ``main`` — the last offline evaluation's
per-slice metric, mined badcases, the scene index and the fleet telemetry's driven hours — and
records the next trigger config version with its expected yield (``curation.
trigger_proposals``). It approves nothing unless its run config names an ``approved_by``: a
person launching it from the launchpad with their name is the recorded approval (as is
``aiinfra triggers approve VERSION --by NAME``). ``trigger_config_release`` signs the newest
approved config into the OTA repository beside the engines; with nothing approved it signs
nothing.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pandas as pd

from aiinfra_pipelines.config import load_resource_yaml, settings_section
from aiinfra_pipelines.curation.trigger_proposals import (
    TriggerProposal,
    driven_hours_by_branch,
    propose_trigger_config,
)
from aiinfra_pipelines.fleet.settings import frame_rate_hz
from aiinfra_pipelines.fleet.triggers import TRIGGERS_CONFIG_FILE
from aiinfra_pipelines.ingest.views import scene_index_view
from aiinfra_pipelines.lake.io_manager import (
    asset_object_base,
    read_asset_partitions,
    read_parquet_prefix,
)
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of

from .keys import ReleaseKeys
from .ota import OtaRefused
from .trigger_ota import (
    approve_trigger_proposal,
    approved_trigger_config,
    proposed_versions,
    record_proposal,
    ship_trigger_config,
)

GROUP = "release"
OFFLINE_EVAL = dg.AssetKey("offline_eval")


# ----------------------------------------------------------------------- plain functions
def slice_metric_from_evaluation(evaluation: Mapping[str, Any] | None) -> dict[str, float]:
    """Slice → candidate occupancy accuracy of an ``offline_eval`` value, for the slices with
    enough frames to be gated (``gates.yaml`` ``offline.min_slice_frames``)."""
    if not evaluation:
        return {}
    min_frames = settings_section("gates.yaml", "offline").int("min_slice_frames")
    return {
        str(row["slice"]): float(row["occupancy_accuracy"])
        for row in evaluation.get("candidate") or []
        if row.get("slice") != "overall"
        and int(row.get("frames") or 0) >= min_frames
        and row.get("occupancy_accuracy") is not None
    }


def current_trigger_document(lake: VersionedLake) -> dict[str, Any]:
    """The config the fleet runs: the newest approved (shipped) one, else triggers.yaml."""
    approved = approved_trigger_config(lake)
    return approved.config if approved else load_resource_yaml(TRIGGERS_CONFIG_FILE)


@dataclass(frozen=True)
class RecordedProposal:
    proposal: TriggerProposal | None
    commit: str | None
    approval: dict[str, Any] | None


def propose_from_lake(
    lake: VersionedLake,
    *,
    root_run_id: str,
    slice_metric: Mapping[str, float | None] | None = None,
    approved_by: str = "",
) -> RecordedProposal:
    """Propose from ``main`` (``slice_metric`` overrides the stored offline evaluation), record
    the proposal, and approve it when ``approved_by`` names a person."""
    if slice_metric is None:
        evaluation = lake.get_json_or_none(
            MAIN_BRANCH, asset_object_base(OFFLINE_EVAL, None) + ".json"
        )
        slice_metric = slice_metric_from_evaluation(evaluation)
    telemetry = read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    proposal = propose_trigger_config(
        current_trigger_document(lake),
        scene_index_view(lake, include_index_only=True),
        slice_metric,
        driven_hours=driven_hours_by_branch(telemetry, frame_rate_hz()),
        badcases=read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH),
        existing_versions=proposed_versions(lake),
    )
    if proposal is None:
        return RecordedProposal(None, None, None)
    commit = record_proposal(lake, proposal.to_document(), root_run_id=root_run_id)
    approval = (
        approve_trigger_proposal(lake, proposal.version, approved_by, root_run_id=root_run_id)
        if approved_by.strip()
        else None
    )
    return RecordedProposal(proposal, commit, approval)


def _markdown(table: pd.DataFrame) -> str:
    shown = table[
        [
            "rule",
            "slice",
            "expression",
            "kept_frames",
            "frames_per_hour",
            "expected_frames_per_hour",
            "share",
            "expected_share",
            "basis",
        ]
    ]
    header = "| " + " | ".join(shown.columns) + " |\n| " + " | ".join("---" for _ in shown) + " |"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, *rows])


# ----------------------------------------------------------------------------------- assets
class TriggerProposalConfig(dg.Config):
    """``approved_by``: the person approving the proposal this run records ("" = none)."""

    approved_by: str = ""


@dg.asset(group_name=GROUP, kinds={"lakefs"}, deps=["offline_eval", "mined_badcases"])
def trigger_proposal(
    context: dg.AssetExecutionContext, config: TriggerProposalConfig, lake: VersionedLake
) -> dg.MaterializeResult:
    """The next trigger config version aimed at the weakest slices, with its expected yield."""
    recorded = propose_from_lake(
        lake, root_run_id=root_run_id_of(context.run), approved_by=config.approved_by
    )
    if recorded.proposal is None:
        return dg.MaterializeResult(metadata={"proposed": False})
    proposal = recorded.proposal
    return dg.MaterializeResult(
        metadata={
            "proposed": True,
            "trigger_config_version": proposal.version,
            "base_version": proposal.base_version,
            "approved_by": (recorded.approval or {}).get("approved_by", ""),
            "publish_commit": recorded.commit or "",
            "expected_yield": dg.MetadataValue.md(_markdown(proposal.yield_table())),
        },
        data_version=dg.DataVersion(proposal.version),
    )


@dg.asset(group_name=GROUP, kinds={"lakefs", "tuf"}, deps=[trigger_proposal])
def trigger_config_release(
    context: dg.AssetExecutionContext, lake: VersionedLake, release_keys: ReleaseKeys
) -> dg.MaterializeResult:
    """Signed OTA metadata listing the newest approved trigger config per vehicle model."""
    try:
        publication = ship_trigger_config(
            lake, release_keys, root_run_id=root_run_id_of(context.run)
        )
    except OtaRefused as refused:
        raise dg.Failure(description=str(refused), allow_retries=False) from refused
    if publication is None:
        return dg.MaterializeResult(metadata={"shipped": False, "reason": "nothing approved"})
    versions = sorted({c["trigger_config_version"] for c in publication.trigger_targets.values()})
    return dg.MaterializeResult(
        metadata={
            "shipped": True,
            "trigger_config_versions": dg.MetadataValue.json(versions),
            "targets": dg.MetadataValue.json(publication.trigger_targets),
            "versions": dg.MetadataValue.json(publication.versions),
            "publish_commit": publication.commit,
        },
        data_version=dg.DataVersion(f"timestamp-v{publication.versions['timestamp']}"),
    )
