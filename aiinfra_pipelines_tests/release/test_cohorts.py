"""Rollout cohorts: stable per vehicle, nested across stages, per-rollout salted, fair."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace

import pytest

from aiinfra_pipelines.fleet.vehicles import build_fleet
from aiinfra_pipelines.release.cohorts import (
    cohort_position,
    in_cohort,
    runs_candidate,
    select_cohort,
)
from aiinfra_pipelines.release.rollout_state import RolloutState

VINS = [vehicle.vin for vehicle in build_fleet(2000)]
STAGES = (1.0, 10.0, 50.0, 100.0)


def test_membership_is_stable_across_processes():
    salt = "rollout-7-abc"
    here = [in_cohort(vin, 10.0, salt) for vin in VINS[:50]]
    code = (
        "from aiinfra_pipelines.release.cohorts import in_cohort;"
        f"print([in_cohort(v, 10.0, {salt!r}) for v in {VINS[:50]!r}])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert there == str(here)
    assert in_cohort(VINS[0].lower(), 10.0, salt) == in_cohort(VINS[0], 10.0, salt)


def test_cohorts_are_nested_from_stage_to_stage():
    salt = "rollout-3-deadbeef"
    cohorts = [select_cohort(VINS, percent, salt) for percent in STAGES]
    for smaller, larger in itertools.pairwise(cohorts):
        assert smaller <= larger
    assert cohorts[-1] == set(VINS)
    assert all(not in_cohort(vin, 0.0, salt) for vin in VINS)


@pytest.mark.parametrize("percent", [1.0, 10.0, 50.0])
def test_cohort_sizes_match_the_percentage(percent):
    share = len(select_cohort(VINS, percent, "salt-a")) / len(VINS)
    # binomial standard deviation over 2000 vehicles is at most ~1.1 percentage points
    assert abs(share * 100 - percent) < 3.5


def test_each_rollout_has_its_own_canary():
    first = select_cohort(VINS, 10.0, "rollout-1-aaaa")
    second = select_cohort(VINS, 10.0, "rollout-2-bbbb")
    assert first != second
    assert len(first & second) < len(first) / 2  # independent draws overlap ~10 %


def test_positions_are_uniform_enough():
    positions = sorted(cohort_position(vin, "salt-b") for vin in VINS)
    assert positions[0] >= 0.0 and positions[-1] < 100.0
    assert abs(positions[len(positions) // 2] - 50.0) < 5.0


def test_only_live_rollouts_put_vehicles_on_the_candidate():
    state = RolloutState(
        model_version="2",
        engine_sha256="c" * 64,
        engine_key="candidates/2/int8.onnx",
        model_uri="",
        cohort_salt="s",
        production_engine_sha256="b" * 64,
        status="in_progress",
        cohort_percent=50.0,
    )
    on_candidate = {vin for vin in VINS[:200] if runs_candidate(state, vin)}
    assert on_candidate == select_cohort(VINS[:200], 50.0, "s")
    for status in ("shadow", "completed", "rolled_back"):
        live = replace(state, status=status)
        assert not any(runs_candidate(live, vin) for vin in VINS[:200])
    assert not runs_candidate(None, VINS[0])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"0\.\.100"):
        in_cohort(VINS[0], 101.0, "s")
    with pytest.raises(ValueError, match="non-empty"):
        in_cohort("", 10.0, "s")
