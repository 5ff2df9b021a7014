"""The demo's trigger loop: propose from the cycle's weak slices, approve, ship, adopt, measure.

After each cycle the demo proposes the next trigger config (``release.assets_triggers.
propose_from_lake``). A proposal changes what every car uploads, so it needs a person's
approval; the demo, having no person at hand, records one *on the operator's behalf* when
``resources/demo.yaml`` ``trigger_proposals.approve`` is true, under the name in ``approver``
(the approval record on the lake says so). It then signs the config into the OTA repository.
Before the next drive every car model fetches it through its TUF client (``VehicleUpdater.
trigger_config``): only a verified config is adopted, so the next cycle's logs carry its
``trigger_config_version`` and the loop summary shows the targeted slice's yield under the old
and the new version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.fleet.triggers import TriggerConfig
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.assets_triggers import propose_from_lake
from aiinfra_pipelines.release.keys import ReleaseKeys
from aiinfra_pipelines.release.ota import OtaSettings, metadata_key, root_metadata
from aiinfra_pipelines.release.ota_client import VehicleUpdater
from aiinfra_pipelines.release.trigger_ota import ship_trigger_config

from .settings import DemoSettings

PROVISIONED_ROOT_VERSION = 1  # the root every car was provisioned with at the factory


class TriggerAdoptionError(RuntimeError):
    """The fleet's car models were offered different trigger configs (one config per drive)."""


def car_cache(model: str) -> Path:
    """A car model's persistent TUF cache (as on the car: it survives between updates)."""
    return dagster_home() / "demo" / "cars" / model


def adopt_trigger_config(
    lake: VersionedLake, settings: OtaSettings | None = None, cache_root: Path | None = None
) -> TriggerConfig | None:
    """The trigger config the cars verified over OTA (``None``: none shipped, they keep theirs).

    Every vehicle model fetches its own signed target; the fleet drives one config, so models
    that were offered different versions are an error rather than a silent pick.
    """
    if not lake.object_exists(MAIN_BRANCH, metadata_key("root")):
        return None
    settings = settings or OtaSettings.load()
    trusted_root = root_metadata(lake, version=PROVISIONED_ROOT_VERSION)
    verified = {}
    for model in settings.vehicle_models:
        updater = VehicleUpdater(
            lake,
            vin=f"demo-{model}",
            vehicle_model=model,
            engine_target=settings.targets_for(model)[0],
            trusted_root=trusted_root,
            cache_dir=(cache_root / model) if cache_root else car_cache(model),
        )
        verified[model] = updater.trigger_config()
    documents = {model: c.document() for model, c in verified.items() if c is not None}
    if not documents:
        return None
    versions = {str(d["version"]) for d in documents.values()}
    if len(versions) > 1 or len(documents) < len(verified):
        raise TriggerAdoptionError(f"car models were offered different trigger configs: {versions}")
    return TriggerConfig.load(config=next(iter(documents.values())))


def propose_approve_ship(
    lake: VersionedLake,
    settings: DemoSettings,
    keys: ReleaseKeys,
    *,
    cycle: int,
    console: Console,
) -> dict[str, Any]:
    """Propose from main's latest evaluation and badcases; approve on the operator's behalf
    when the demo is configured to; ship what is approved. The summary.json entry."""
    run_id = f"demo-triggers-c{cycle}"
    approver = settings.trigger_approver if settings.approve_trigger_proposals else ""
    recorded = propose_from_lake(lake, root_run_id=run_id, approved_by=approver)
    if recorded.proposal is None:
        console.print("[bold]triggers[/] nothing to propose: no weak slice or badcase cluster")
        return {"proposed": None}
    proposal = recorded.proposal
    for rule in proposal.rules:
        y = rule.expected_yield
        console.print(
            f"[bold]trigger proposal[/] {proposal.version} (base {proposal.base_version}): "
            f"{rule.name} for {rule.slice} ({escape(rule.reason)}), `{escape(rule.expression)}`; "
            f"{y.frames_per_hour} → {y.expected_frames_per_hour} frames/h expected "
            f"(share {y.share:.1%} → {y.expected_share:.1%}; {y.basis})"
        )
    shipped = None
    if recorded.approval is not None:
        publication = ship_trigger_config(lake, keys, root_run_id=run_id)
        shipped = publication.versions if publication else None
        console.print(
            f"[bold]triggers[/] {proposal.version} approved by {recorded.approval['approved_by']}"
            " (demo.yaml trigger_proposals.approve) and signed into the"
            f" OTA repository (metadata {shipped}); the next drive adopts it"
        )
    else:
        console.print(
            f"[bold]triggers[/] {proposal.version} awaits approval: "
            f"aiinfra triggers approve {proposal.version} --by NAME"
        )
    return {
        "proposed": proposal.version,
        "base_version": proposal.base_version,
        "approved_by": (recorded.approval or {}).get("approved_by"),
        "ota_versions": shipped,
        "rules": proposal.yield_table().to_dict(orient="records"),
    }
