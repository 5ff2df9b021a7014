"""The simulation layer's Dagster definitions."""

import dagster as dg

from .assets import (
    regression_no_new_failures,
    regression_report,
    regression_simulation,
    scenario_library,
)

defs = dg.Definitions(
    assets=[scenario_library, regression_simulation, regression_report],
    asset_checks=[regression_no_new_failures],
)
