"""The operations layer's Dagster definitions: assets, and the clock the monitors run on."""

import dagster as dg

from aiinfra_pipelines.config import settings_section

from .assets import compute_cost_ledger, drift_monitor, fleet_telemetry
from .failures import loop_failures
from .retention_assets import retention

_CRON = settings_section("operations.yaml", "schedules")

# fleet_telemetry follows landings (telemetry_sensor); the monitors look at the whole loop,
# so they run on a clock rather than on any one upstream change.
drift_monitor_schedule = dg.ScheduleDefinition(
    name="drift_monitor_schedule",
    target=dg.AssetSelection.assets(drift_monitor),
    cron_schedule=_CRON.str("drift_monitor_cron"),
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Input and confidence drift of the recent fleet vs the training data.",
)
compute_cost_ledger_schedule = dg.ScheduleDefinition(
    name="compute_cost_ledger_schedule",
    target=dg.AssetSelection.assets(compute_cost_ledger),
    cron_schedule=_CRON.str("compute_cost_ledger_cron"),
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="CPU/GPU seconds per asset, partition and group from the run records.",
)

defs = dg.Definitions(
    # retention is never automated: an operator runs it (a dry run unless approved).
    assets=[fleet_telemetry, drift_monitor, compute_cost_ledger, loop_failures, retention],
    schedules=[drift_monitor_schedule, compute_cost_ledger_schedule],
)
