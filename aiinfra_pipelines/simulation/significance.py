"""Is the candidate worse than production beyond what the dice explain?

Each closed-loop episode is a draw: traffic and sensor noise decide whether a borderline
scenario passes. Two engines of equal quality differ on a scenario's nine seeds by two or three
passes quite often, and across a library of dozens of scenarios some scenario always does. A
threshold alone (a pass rate of 0.66, a budget of 0.15 on 18 episodes) therefore refuses equal
candidates by chance. The gate additionally asks the standard question for two proportions on
small samples — Fisher's exact test, one-sided: if both engines failed at the same rate, how
likely is a split of the pooled failures at least this lopsided against the candidate?

Exact, no approximation: the candidate's failures given the pooled total are hypergeometric.
"""

from __future__ import annotations

from math import comb


def worse_by_chance_p(
    candidate_bad: int, candidate_n: int, production_bad: int, production_n: int
) -> float:
    """One-sided Fisher exact p-value of "the candidate fails more often than production".

    ``*_bad`` are failed (or at-fault) episodes out of ``*_n``. Small p: the candidate's excess
    of failures is unlikely under equal quality. A candidate failing no more often than
    production gets p >= 0.5.
    """
    for name, bad, n in (
        ("candidate", candidate_bad, candidate_n),
        ("production", production_bad, production_n),
    ):
        if n < 0 or bad < 0 or bad > n:
            raise ValueError(f"{name}: {bad} failures of {n} episodes is not a sample")
    total = candidate_n + production_n
    failures = candidate_bad + production_bad
    if total == 0 or failures == 0:
        return 1.0
    denominator = comb(total, candidate_n)
    tail = sum(
        comb(failures, k) * comb(total - failures, candidate_n - k)
        for k in range(candidate_bad, min(failures, candidate_n) + 1)
    )
    return min(1.0, tail / denominator)
