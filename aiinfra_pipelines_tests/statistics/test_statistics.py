"""The gates' statistics against known values and their defining properties."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from aiinfra_pipelines.statistics.binomial import clopper_pearson
from aiinfra_pipelines.statistics.multiplicity import holm_level, holm_rejections
from aiinfra_pipelines.statistics.paired import (
    PairedCounts,
    _tango_statistic,
    sign_test_p,
    tango_bound,
    total,
)


def test_the_sign_test_is_the_exact_one_sided_binomial_on_discordant_pairs():
    assert sign_test_p(12, 0) == pytest.approx(0.5**12)
    assert sign_test_p(0, 5) == 1.0
    assert sign_test_p(0, 0) == 1.0  # no discordant pair: no evidence
    assert sign_test_p(3, 3) == pytest.approx(42 / 64)
    for worse, better in ((7, 2), (14, 1), (1, 0), (20, 11)):
        expected = binomtest(worse, worse + better, 0.5, alternative="greater").pvalue
        assert sign_test_p(worse, better) == pytest.approx(expected)
    with pytest.raises(ValueError):
        sign_test_p(-1, 2)


def test_paired_counts_come_from_aligned_outcomes_and_pool_across_strata():
    counts = PairedCounts.of([True, True, False, False, True], [False, True, True, False, False])
    assert counts == PairedCounts(worse=2, better=1, pairs=5)
    assert counts.difference == pytest.approx(0.2)
    assert counts.sign_z() == pytest.approx(1 / np.sqrt(3))
    assert total([counts, PairedCounts(1, 0, 4)]) == PairedCounts(3, 1, 9)
    with pytest.raises(ValueError, match="not paired counts"):
        PairedCounts(4, 3, 6)


def test_tango_bounds_match_the_published_example():
    """Fagerland, Lydersen & Laake (2017), The Paired 2x2 Table: airway hyper-responsiveness
    before and after stem cell transplantation (Bentur et al. 2009), n12 = 1, n21 = 7,
    N = 21: the Tango asymptotic score 95 % interval is (-0.517, -0.026)."""
    counts = PairedCounts(worse=1, better=7, pairs=21)
    assert tango_bound(counts, 0.025, upper=False) == pytest.approx(-0.5172, abs=5e-4)
    assert tango_bound(counts, 0.025, upper=True) == pytest.approx(-0.0260, abs=5e-4)


def test_a_tango_bound_is_where_the_score_statistic_crosses_its_quantile():
    for counts in (PairedCounts(40, 20, 160), PairedCounts(0, 0, 400), PairedCounts(3, 9, 50)):
        upper = tango_bound(counts, 0.05)
        lower = tango_bound(counts, 0.05, upper=False)
        assert lower <= counts.difference <= upper
        assert _tango_statistic(counts, upper) == pytest.approx(-1.6449, abs=1e-3)
        if lower > -1:
            assert _tango_statistic(counts, lower) == pytest.approx(1.6449, abs=1e-3)
    assert tango_bound(PairedCounts(0, 0, 0), 0.05) == 1.0  # nothing known
    # Zero discordance on 400 pairs still bounds the difference away from a large one.
    assert 0 < tango_bound(PairedCounts(0, 0, 400), 0.05) < 0.01


def test_an_upper_tango_bound_covers_the_true_difference_as_often_as_it_claims():
    """One-sided 95 % bounds over 2,000 simulated samples of 300 pairs, a difference of 0.03:
    the bound falls below the truth about 5 % of the time (seeded, so exact for these draws)."""
    rng = np.random.default_rng(0)
    p_worse, p_better, n = 0.08, 0.05, 300
    misses = 0
    for _ in range(2000):
        draws = rng.choice(3, size=n, p=[p_worse, p_better, 1 - p_worse - p_better])
        counts = PairedCounts(int((draws == 0).sum()), int((draws == 1).sum()), n)
        misses += tango_bound(counts, 0.05) < p_worse - p_better
    assert 0.03 <= misses / 2000 <= 0.07


def test_holm_steps_down_and_stops_at_the_first_survivor():
    p = {"a": 0.001, "b": 0.012, "c": 0.04, "d": 0.3}
    assert holm_rejections(p, 0.05) == {"a": 0.0125, "b": pytest.approx(0.05 / 3)}
    assert holm_level(p, "c", 0.05) == pytest.approx(0.025)
    assert holm_rejections({"a": 0.02, "b": 0.001}, 0.05) == {"b": 0.025, "a": 0.05}
    assert holm_rejections({}, 0.05) == {}


def test_clopper_pearson_matches_known_exact_intervals():
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 0.3085), abs=1e-4)
    assert clopper_pearson(5, 10) == pytest.approx((0.1871, 0.8129), abs=1e-4)
    assert clopper_pearson(10, 10)[1] == 1.0
    assert clopper_pearson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)
