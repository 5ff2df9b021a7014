"""The mining layer's Dagster definitions."""

import dagster as dg

from .assets import auto_labels, mined_badcases, published_mining

defs = dg.Definitions(assets=[auto_labels, mined_badcases, published_mining])
