"""Sequential rate-ratio tests: exact values on hand-computable cases, validity under repeated
looks, and the decisions in both directions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from aiinfra_pipelines.statistics.sequential_rates import (
    RateBatch,
    RateTest,
    judge_rates,
    log_likelihood,
    mixture_e_value,
    pooled_ratio,
)

TEST = RateTest(
    margin=2.0,
    harm_alpha=0.01,
    noninferiority_alpha=0.05,
    harm_alternatives=(1.25, 1.5, 2.0, 3.0, 4.0, 6.0),
    noninferiority_alternatives=(0.5, 0.75, 1.0, 1.25, 1.5),
)


def test_the_likelihood_is_the_conditional_binomial_of_the_candidates_share():
    batch = RateBatch(3, 1000, 5, 3000)  # equal exposure shares: p = r / (r + 3)
    for ratio in (0.5, 1.0, 2.0):
        share = ratio / (ratio + 3.0)
        expected = 3 * math.log(share) + 5 * math.log(1 - share)
        assert log_likelihood([batch], ratio) == pytest.approx(expected)
    # Batches without events or without exposure carry no information.
    assert log_likelihood([RateBatch(0, 1000, 0, 3000), RateBatch(2, 0, 1, 10)], 2.0) == 0.0


def test_the_mixture_averages_likelihood_ratios_over_the_alternatives():
    batches = [RateBatch(6, 1000, 2, 1000)]
    ratios = [math.exp(log_likelihood(batches, r) - log_likelihood(batches, 1.0)) for r in (2, 4)]
    assert mixture_e_value(batches, 1.0, (2.0, 4.0)) == pytest.approx(sum(ratios) / 2)


def test_the_pooled_interval_is_clopper_pearson_on_the_share_mapped_to_a_ratio():
    batches = [RateBatch(4, 2000, 10, 8000), RateBatch(3, 1000, 5, 4000)]
    ratio, (low, high) = pooled_ratio(batches)
    assert ratio == pytest.approx((7 / 3000) / (15 / 12000))
    ci = binomtest(7, 22).proportion_ci(0.95, method="exact")
    odds = 12000 / 3000
    assert low == pytest.approx(ci.low / (1 - ci.low) * odds)
    assert high == pytest.approx(ci.high / (1 - ci.high) * odds)


def test_one_event_is_no_evidence_either_way_and_says_what_it_needs():
    verdict = judge_rates(TEST, [RateBatch(1, 200, 12, 10_000)], prior_rate=1.2e-3)
    assert verdict.outcome == "undecided"
    assert verdict.rate_ratio == pytest.approx((1 / 200) / (12 / 10_000))  # 4x, on one event
    assert verdict.ratio_interval[1] is not None and verdict.ratio_interval[0] < 1.0
    assert verdict.exposure_needed is not None and verdict.exposure_needed > 1000
    # The stated exposure is enough: at those rates, that much more decides.
    rate_c, rate_0 = 1.5 / (200 + 0.5 / 1.2e-3), 12.5 / (10_000 + 0.5 / 1.2e-3)
    extra = verdict.exposure_needed * 1.001
    projected = RateBatch(rate_c * extra, extra, rate_0 * extra * 50, extra * 50)
    assert judge_rates(TEST, [RateBatch(1, 200, 12, 10_000), projected], 1.2e-3).outcome != (
        "undecided"
    )


def test_clear_harm_and_clear_equality_decide():
    harm = judge_rates(TEST, [RateBatch(60, 20_000, 30, 40_000)], 1.2e-3)  # 4x
    assert harm.outcome == "harm" and harm.harm_e_value >= 100 and harm.exposure_needed is None
    equal = judge_rates(TEST, [RateBatch(60, 20_000, 120, 40_000)], 1.2e-3)
    assert equal.outcome == "non_inferior" and equal.noninferiority_e_value >= 20


def test_looking_after_every_batch_keeps_the_false_harm_rate_below_alpha():
    """Ville's inequality, checked: equal cohorts, 800 streams of 40 looks each."""
    rng = np.random.default_rng(3)
    crossed = 0
    for _ in range(800):
        batches = []
        for _ in range(40):
            batches.append(RateBatch(rng.poisson(1.2), 1000, rng.poisson(12.0), 10_000))
            if mixture_e_value(batches, 1.0, TEST.harm_alternatives) >= 1 / TEST.harm_alpha:
                crossed += 1
                break
    assert crossed / 800 <= TEST.harm_alpha


@pytest.mark.parametrize(
    "change",
    [
        {"margin": 1.0},
        {"harm_alpha": 0.0},
        {"harm_alternatives": (0.9, 2.0)},
        {"noninferiority_alternatives": (0.5, 2.5)},
    ],
)
def test_a_test_that_cannot_mean_what_it_says_is_refused(change):
    values = {**TEST.__dict__, **change}
    with pytest.raises(ValueError):
        RateTest(**values)
