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

from aiinfra_pipelines.lake.layout import (
    MAIN_BRANCH,
    PRODUCTION_POINTER_KEY,
    candidate_manifest_key,
    candidate_report_key,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .rollout import production_pointer
from .rollout_store import read_current

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
    if state is not None and state.is_active and state.model_version != str(excluding):
        version = state.model_version
        key = candidate_manifest_key(version)
        manifest = lake.get_json_or_none(MAIN_BRANCH, key)
        if manifest is not None:
            pointer = production_pointer(manifest, lake.resolve_ref(MAIN_BRANCH))
            return {**pointer, "source": ROLLOUT}
    pointer = lake.get_json_or_none(MAIN_BRANCH, PRODUCTION_POINTER_KEY)
    return None if pointer is None else {**pointer, "source": PRODUCTION}


def gated_against(lake: VersionedLake, model_version: str, ref: str = MAIN_BRANCH) -> str | None:
    """The release ``model_version``'s gates judged it against, when its offline and
    simulation reports name the same one; ``None`` when a report is missing, predates the
    field, or they disagree (the reference moved between the two gates)."""
    versions: set[str] = set()
    for gate in REFERENCE_GATES:
        report = lake.get_json_or_none(ref, candidate_report_key(str(model_version), gate))
        version = (report or {}).get("reference_version")
        if version is None:
            return None
        versions.add(str(version))
    return versions.pop() if len(versions) == 1 else None
