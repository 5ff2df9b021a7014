"""The release layer's Dagster definitions."""

import dagster as dg

from .assets_certification import certificate_valid, certified_engine
from .assets_ota import ota_release
from .assets_rollout import rollout, shadow_report
from .assets_triggers import trigger_config_release, trigger_proposal
from .ota import OtaSettings

# Vehicles reject a timestamp older than its expiry (a freeze attack looks exactly like a
# repository nobody re-signs), so the OTA metadata is refreshed on a clock, not only when a
# rollout decision changes the targets.
ota_timestamp_refresh = dg.ScheduleDefinition(
    name="ota_timestamp_refresh",
    target=dg.AssetSelection.assets(ota_release),
    cron_schedule=OtaSettings.load().timestamp_refresh_cron,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Re-sign the OTA timestamp (ota_release) before it expires.",
)

defs = dg.Definitions(
    assets=[
        certified_engine,
        shadow_report,
        rollout,
        ota_release,
        trigger_proposal,
        trigger_config_release,
    ],
    asset_checks=[certificate_valid],
    schedules=[ota_timestamp_refresh],
)
