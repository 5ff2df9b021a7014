"""The staged rollout meets the error rates gates.yaml states, measured through its own code.

The calibration (``release.rollout_calibration``) pushes simulated telemetry streams through
``evaluate_stage`` publish by publish. Seeded, so the figures are exact for these draws and
the test pins them against the stated targets: a change to the rollout's tests that rolls back
equal engines more often, or lets a 2x at-fault engine through, fails here.
``benchmarks/canary_calibration.py`` prints the same figures over more trials.
"""

from __future__ import annotations

import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.release.rollout_calibration import calibrate_rollout, stated_targets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TRIALS = 120


def test_the_rollout_rolls_back_harm_and_advances_an_equal_engine_at_the_stated_rates():
    gates = load_resource_yaml("gates.yaml")
    figures = calibrate_rollout(TRIALS, gates, seed=5)
    targets = stated_targets(gates)
    assert set(targets) == {"equal_rolled_back", "harm_2x_rolled_back", "equal_advanced"}
    missed = {
        name: (figures[name], op, value)
        for name, (op, value) in targets.items()
        if (figures[name] > value if op == "<=" else figures[name] < value)
    }
    assert missed == {}, missed
    assert figures["trials"] == TRIALS
    # Decisions rest on exposure, not on a first event: thousands of frames either way.
    assert figures["median_frames_to_rollback_2x"] > 2_000
    assert figures["median_frames_to_advance_equal"] > figures["median_frames_to_rollback_2x"]
