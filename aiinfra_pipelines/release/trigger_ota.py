"""Trigger configs from proposal to car: record, approve, ship as a signed OTA target.

A proposal (``curation.trigger_proposals``) changes what every car uploads, so it reaches the
fleet only after a person approved it, as the full rollout of an engine does. The lake keeps
each proposed version (``release/triggers/proposals/<version>.json``, ``latest.json`` naming
the newest) and each approval (``release/triggers/approvals/<version>.json``: who, when, and
the SHA-256 of the exact proposal they approved). Only the newest proposal can be approved: an
older one is superseded, its expected yield computed on data the newer one has seen.

Shipping lists the newest approved config as its own TUF target per vehicle model
(``triggers/<model>/trigger-config.json``, ``custom.trigger_config_version``) next to the
engines, signed by the same targets/snapshot/timestamp roles; cars verify it with
``VehicleUpdater.trigger_config`` and load it with ``TriggerConfig.load(config=...)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.lake.layout import (
    LATEST_TRIGGER_PROPOSAL_KEY,
    MAIN_BRANCH,
    TRIGGER_APPROVALS_PREFIX,
    TRIGGER_PROPOSALS_PREFIX,
    trigger_approval_key,
    trigger_proposal_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects

from .keys import ReleaseKeys
from .ota import OtaSettings, plan_offers
from .ota_signing import OtaFile, OtaPublication, publish_ota_repository, trigger_target_path

TRIGGER_CONFIG_KIND = "trigger_config"


class TriggerApprovalError(RuntimeError):
    """An approval that cannot be recorded: unknown or superseded proposal, no approver."""


def _canonical(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _now(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------- proposals
def latest_proposal_version(lake: VersionedLake, ref: str = MAIN_BRANCH) -> str | None:
    pointer = lake.get_json_or_none(ref, LATEST_TRIGGER_PROPOSAL_KEY)
    return str(pointer["version"]) if pointer else None


def read_proposal(lake: VersionedLake, version: str, ref: str = MAIN_BRANCH) -> dict | None:
    return lake.get_json_or_none(ref, trigger_proposal_key(version))


def proposed_versions(lake: VersionedLake, ref: str = MAIN_BRANCH) -> list[str]:
    """Every version ever proposed (never reused by a later proposal)."""
    prefix = TRIGGER_PROPOSALS_PREFIX
    keys = [stat.key for stat in lake.list_objects(ref, prefix)]
    return sorted(
        key[len(prefix) : -len(".json")]
        for key in keys
        if key != LATEST_TRIGGER_PROPOSAL_KEY and key.endswith(".json")
    )


def record_proposal(
    lake: VersionedLake,
    document: Mapping[str, Any],
    *,
    root_run_id: str,
    now: datetime | None = None,
) -> str:
    """Publish a proposal document and make it the latest; returns the publish commit.

    The config it carries must load as a car would load it, and a version is recorded once:
    re-recording the same document is a no-op publish, a different one under a used version
    is refused.
    """
    version = str(document["version"])
    config = TriggerConfig.load(config=document["config"])
    if config.version != version:
        raise TriggerApprovalError(f"proposal {version} carries config version {config.version}")
    data = _canonical(document)
    key = trigger_proposal_key(version)
    if lake.object_exists(MAIN_BRANCH, key) and lake.get_object(MAIN_BRANCH, key) != data:
        raise TriggerApprovalError(f"trigger config {version} was already proposed differently")
    pointer = {"version": version, "proposal_sha256": _sha256(data), "proposed_at": _now(now)}
    return publish_objects(
        lake,
        root_run_id,
        {key: data, LATEST_TRIGGER_PROPOSAL_KEY: _canonical(pointer)},
        f"trigger proposal {version} (base {document.get('base_version')})",
        {"kind": "trigger_proposal", "trigger_config_version": version},
    )


# ------------------------------------------------------------------------------- approvals
def approve_trigger_proposal(
    lake: VersionedLake,
    version: str,
    approved_by: str,
    *,
    root_run_id: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Record ``approved_by``'s approval of proposal ``version``; returns the approval record.

    Refused for an unknown version, a superseded one (not the latest proposal) and without an
    approver's name. Approving an approved version again returns the first approval.
    """
    approver = approved_by.strip()
    if not approver:
        raise TriggerApprovalError("an approval needs the approver's name")
    key = trigger_proposal_key(version)
    if not lake.object_exists(MAIN_BRANCH, key):
        known = ", ".join(proposed_versions(lake)) or "none"
        raise TriggerApprovalError(f"no trigger proposal {version!r} (proposed: {known})")
    latest = latest_proposal_version(lake)
    if latest != version:
        raise TriggerApprovalError(
            f"trigger proposal {version} is superseded by {latest}: approve {latest} instead"
        )
    existing = lake.get_json_or_none(MAIN_BRANCH, trigger_approval_key(version))
    if existing is not None:
        return existing
    approval = {
        "version": version,
        "approved_by": approver,
        "approved_at": _now(now),
        "proposal_sha256": _sha256(lake.get_object(MAIN_BRANCH, key)),
    }
    publish_objects(
        lake,
        root_run_id,
        {trigger_approval_key(version): _canonical(approval)},
        f"trigger config {version} approved by {approver}",
        {"kind": "trigger_approval", "trigger_config_version": version, "approved_by": approver},
    )
    return approval


@dataclass(frozen=True)
class ApprovedTriggerConfig:
    """The newest approved proposal: its config document and who approved it when."""

    version: str
    base_version: str
    config: dict[str, Any]
    approval: dict[str, Any]


def approved_trigger_config(
    lake: VersionedLake, ref: str = MAIN_BRANCH
) -> ApprovedTriggerConfig | None:
    """The most recently approved proposal whose stored bytes are the ones approved.

    A proposal changed after its approval (hash mismatch) is refused, not shipped.
    """
    approvals = [
        lake.get_json_or_none(ref, stat.key)
        for stat in lake.list_objects(ref, TRIGGER_APPROVALS_PREFIX)
        if stat.key.endswith(".json")
    ]
    approvals = [a for a in approvals if a]
    if not approvals:
        return None
    newest = max(approvals, key=lambda a: (str(a["approved_at"]), str(a["version"])))
    version = str(newest["version"])
    data = lake.get_object(ref, trigger_proposal_key(version))
    if _sha256(data) != newest["proposal_sha256"]:
        raise TriggerApprovalError(
            f"trigger proposal {version} changed after {newest['approved_by']} approved it"
        )
    document = json.loads(data)
    return ApprovedTriggerConfig(
        version, str(document.get("base_version", "")), dict(document["config"]), newest
    )


# -------------------------------------------------------------------------------- shipping
def trigger_target_files(
    approved: ApprovedTriggerConfig, settings: OtaSettings | None = None
) -> list[OtaFile]:
    """One signed target per vehicle model carrying the approved config document."""
    settings = settings or OtaSettings.load()
    data = _canonical(approved.config)
    return [
        OtaFile(
            path=trigger_target_path(model),
            data=data,
            custom={
                "kind": TRIGGER_CONFIG_KIND,
                "trigger_config_version": approved.version,
                "base_version": approved.base_version,
                "vehicle_model": model,
                "approved_by": str(approved.approval["approved_by"]),
                "approved_at": str(approved.approval["approved_at"]),
                "proposal_sha256": str(approved.approval["proposal_sha256"]),
            },
        )
        for model in settings.vehicle_models
    ]


def ship_trigger_config(
    lake: VersionedLake,
    keys: ReleaseKeys,
    *,
    root_run_id: str,
    now: datetime | None = None,
    settings: OtaSettings | None = None,
) -> OtaPublication | None:
    """Sign the next OTA repository version listing the newest approved trigger config beside
    the certified engines; ``None`` (nothing signed) while no proposal is approved."""
    approved = approved_trigger_config(lake)
    if approved is None:
        return None
    settings = settings or OtaSettings.load()
    offers = plan_offers(lake, keys.certificate_public_key(), settings)
    return publish_ota_repository(
        lake,
        keys,
        offers,
        root_run_id=root_run_id,
        now=now,
        settings=settings,
        trigger_files=trigger_target_files(approved, settings),
    )
