"""The reference release: the model a new candidate starts from and is gated against.

Production (``release/production.json``) moves only when a rollout completes, which takes an
approval and days of telemetry. Meanwhile the fleet is already moving to the certified release
being rolled out, and the loop keeps retraining. A candidate gated against the older production
could pass while being worse than the release half the fleet already runs. So the reference is
the *newest release on the fleet*: the release whose rollout is in progress (or awaiting its
approval), else production, else none (a first release, held to the absolute floors).
"""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.datasets.selection import read_json_if_exists
from aiinfra_pipelines.lake.layout import PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import MAIN_BRANCH

from .certificate import default_report_key, manifest_key
from .rollout import ACTIVE_STATUSES, production_pointer, read_current

ROLLOUT, PRODUCTION = "rollout", "production"
# The gate reports that compare a candidate with its reference release (each records the
# reference's version as ``reference_version``).
REFERENCE_GATES = ("offline_eval", "regression_simulation")


def reference_release(lake: VersionedLake, excluding: str | None = None) -> dict[str, Any] | None:
    """A ``production.json``-shaped pointer to the reference release, plus ``source``.

    ``source`` is ``rollout`` (an active rollout's certified release) or ``production``.
    ``excluding`` is the candidate being judged: a release is never its own reference (a
    re-evaluation of the version now rolling out compares it with production).
    """
    state = read_current(lake)
    if (
        state is not None
        and state.get("status") in ACTIVE_STATUSES
        and str(state["model_version"]) != str(excluding)
    ):
        version = str(state["model_version"])
        key = manifest_key(version)
        if lake.object_exists(MAIN_BRANCH, key):
            manifest = lake.get_json(MAIN_BRANCH, key)
            pointer = production_pointer(manifest, lake.resolve_ref(MAIN_BRANCH))
            return {**pointer, "source": ROLLOUT}
    if lake.object_exists(MAIN_BRANCH, PRODUCTION_POINTER_KEY):
        return {**lake.get_json(MAIN_BRANCH, PRODUCTION_POINTER_KEY), "source": PRODUCTION}
    return None


def gated_against(lake: VersionedLake, model_version: str, ref: str = MAIN_BRANCH) -> str | None:
    """The release ``model_version``'s gates judged it against, when its offline and
    simulation reports name the same one; ``None`` when a report is missing, predates the
    field, or they disagree (the reference moved between the two gates)."""
    versions: set[str] = set()
    for gate in REFERENCE_GATES:
        report = read_json_if_exists(lake, default_report_key(str(model_version), gate), ref)
        version = (report or {}).get("reference_version")
        if version is None:
            return None
        versions.add(str(version))
    return versions.pop() if len(versions) == 1 else None
