"""Which vehicles run the candidate engine during a staged rollout.

A vehicle's place in the rollout order is a salted hash of its key (VIN on the vehicle/OTA
side), mapped to a position in [0, 100). A vehicle is in the p % cohort when its position is
below p, so cohorts are *nested*: every vehicle of the 1 % canary stays in the 10 % stage, and
a vehicle never flips between candidate and production while the rollout widens. The salt is
per rollout (recorded in the rollout state), so each candidate gets a different canary and no
car is always first.

Pure functions with no I/O: the OTA server, the simulated fleet and the tests all call them
and must agree bit for bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from .rollout_state import ACTIVE_STATUSES, RolloutState

HASH_SPACE = 2**64
# Rollout statuses in which the candidate is installed on its cohort (release/rollout/<v>.json).
CANDIDATE_STATUSES = ACTIVE_STATUSES


def cohort_position(vehicle_key: str, salt: str) -> float:
    """The vehicle's position in this rollout's order, uniform in [0, 100)."""
    if not vehicle_key:
        raise ValueError("vehicle_key must be a non-empty string")
    digest = hashlib.sha256(f"{salt}\x00{vehicle_key.strip().upper()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / HASH_SPACE * 100.0


def in_cohort(vehicle_key: str, percent: float, salt: str) -> bool:
    """Whether the vehicle belongs to the ``percent`` % cohort of the rollout salted ``salt``.

    Stable (same answer on every call, machine and process) and monotone in ``percent``.
    """
    if not 0.0 <= percent <= 100.0:
        raise ValueError(f"cohort percent must be within 0..100, got {percent}")
    if percent >= 100.0:
        return True
    return cohort_position(vehicle_key, salt) < percent


def select_cohort(vehicle_keys: Iterable[str], percent: float, salt: str) -> set[str]:
    """The members of the ``percent`` % cohort within a known fleet (for fleet tools and tests).

    Deliberately no "at least N vehicles" top-up: a vehicle decides its own membership from
    the percent and salt alone (the OTA client, ``trace``), so the cohort must be exactly
    :func:`in_cohort`. A small fleet's 1 % canary is usually empty; the rollout then waits for
    its minimum candidate sample (or the stage percentages are set for that fleet).
    """
    return {key for key in vehicle_keys if in_cohort(key, percent, salt)}


def candidate_cohort_percent(state: RolloutState | None) -> float:
    """The share of the fleet that runs the candidate of ``state`` right now (0 when none)."""
    if state is None or state.status not in CANDIDATE_STATUSES:
        return 0.0
    return state.cohort_percent


def runs_candidate(state: RolloutState | None, vehicle_key: str) -> bool:
    """Whether ``vehicle_key`` runs the candidate of rollout ``state`` (else production).

    ``state`` is a rollout state (``release/rollout/<v>.json``); the same rule the vehicle's
    OTA client applies to the cohort percent and salt its targets metadata carries.
    """
    percent = candidate_cohort_percent(state)
    if percent <= 0.0 or state is None:
        return False
    return in_cohort(vehicle_key, percent, state.cohort_salt)
