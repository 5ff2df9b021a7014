"""Mining asks the fleet for more of what the model is weak at.

The scene index knows segments the cars kept only as index records; where the last offline
evaluation found a slice weak, its index-only segments are worth their megabytes after all.
This turns the weakest slices into one pull request (``ingest.pulls``); the cars that still
hold the segments send them in their next upload window.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiinfra_pipelines.ingest.pulls import request_raw_segments, requested_log_ids
from aiinfra_pipelines.ingest.views import raw_available, scene_index_view
from aiinfra_pipelines.lake.port import VersionedLake

from .settings import PullSettings

REQUESTED_BY = "mining:weak-slices"


def pull_weak_slices(
    lake: VersionedLake,
    slice_accuracy: Mapping[str, float | None],
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Request the index-only segments of the weakest slices (mining.yaml ``pulls``).

    ``slice_accuracy``: slice → benchmark accuracy of the last evaluation (``None``: not
    measured, ranked last). Returns what was asked for, for the loop summary.
    """
    settings = PullSettings.load(config)
    index = scene_index_view(lake, include_index_only=True)
    if index.empty:
        return {"slices": [], "requested": 0, "request_id": None}
    held = index[~raw_available(index)]
    with_segments = set(held["slice"])
    ranked = sorted(
        (name for name in slice_accuracy if name in with_segments),
        key=lambda name: (slice_accuracy[name] is None, slice_accuracy[name] or 0.0),
    )
    weak = ranked[: settings.weak_slices]
    asked = requested_log_ids(lake)
    log_ids = [
        log_id
        for log_id in dict.fromkeys(held.loc[held["slice"].isin(weak), "log_id"])
        if log_id not in asked  # asked already: served, closed or still waiting
    ][: settings.max_segments]
    if not log_ids:
        return {"slices": weak, "requested": 0, "request_id": None}
    result = request_raw_segments(
        lake,
        index,
        log_ids,
        reason=f"weak slice(s) in the last offline evaluation: {', '.join(weak)}",
        requested_by=REQUESTED_BY,
    )
    return {
        "slices": weak,
        "requested": len(result.requested),
        "request_id": result.request_id,
        "skipped": len(result.skipped),
    }
