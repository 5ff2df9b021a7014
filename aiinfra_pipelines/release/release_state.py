"""What is in production and how every rollout stands, as one view (``aiinfra status`` and the
``rollout`` asset's ``release_state`` metadata show the same rows)."""

from __future__ import annotations

from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.port import VersionedLake

from .rollout_state import ROLLED_BACK, RolloutState

RELEASE_STATE_COLUMNS = ("version", "status", "stage", "decision", "frames", "needed", "reason")


def production_line(lake: VersionedLake, ref: str = MAIN_BRANCH) -> str:
    """Which release the fleet runs (``release/production.json`` at ``ref``)."""
    pointer = lake.get_json_or_none(ref, PRODUCTION_POINTER_KEY)
    if not pointer:
        return "production: none released yet (the fleet drives its pre-release stack)"
    engine = str(pointer.get("engine_sha256", ""))[:12]
    return f"production: model version {pointer.get('version')} (engine {engine})"


def rollout_rows(states: list[RolloutState]) -> list[dict[str, str]]:
    """One row per release's rollout: stage, status, its last decision and the exposure it rested
    on and still needs (rollbacks are failures: their status says so)."""
    rows = []
    for state in states:
        decision = state.last_decision() or {}
        needed = decision.get("exposure_needed_frames")
        rows.append(
            {
                "version": state.model_version,
                "status": "ROLLED BACK" if state.status == ROLLED_BACK else state.status,
                "stage": f"{state.stage} ({state.cohort_percent:g} %)",
                "decision": str(decision.get("action") or "-"),
                "frames": str(decision.get("exposure_frames") or "-"),
                "needed": "-" if needed is None else f"{needed:,}",
                "reason": str(state.last_event.get("reason", ""))[:100],
            }
        )
    return rows
