"""The offline gate meets the error rates gates.yaml states for it, measured through its code.

Simulated benchmarks shaped like the demo's go through ``compare_with_production`` with their
per-frame scores, as ``offline_eval`` hands them over. Seeded: the figures are exact for these
draws. The budgets alone (no significance) refuse an equal candidate about half the time on
such benchmarks — the measured reason the gate asks for significance.
"""

from __future__ import annotations

import copy

import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.evaluation.calibration import calibrate_offline, offline_targets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_offline_gate_certifies_an_equal_candidate_and_refuses_a_slice_regression():
    gates = load_resource_yaml("gates.yaml")
    targets = offline_targets(gates)
    assert set(targets) == {"offline_aa_certified", "offline_slice_regression_refused"}
    figures = calibrate_offline(100, gates, seed=3)
    assert {name: figures[name] for name in targets if figures[name] < targets[name]} == {}
    budgets_alone = copy.deepcopy(gates)
    budgets_alone["offline"]["significance"] = None
    before = calibrate_offline(40, budgets_alone, seed=3)
    assert before["offline_aa_certified"] < targets["offline_aa_certified"]
