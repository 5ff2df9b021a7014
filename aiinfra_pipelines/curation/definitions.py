"""The curation layer's Dagster definitions."""

import dagster as dg

from .similarity_assets import more_like_this, similarity_index

defs = dg.Definitions(assets=[similarity_index, more_like_this])
