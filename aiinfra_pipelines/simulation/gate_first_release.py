"""The gate before the first release: non-inferior to the oracle, paired.

With nothing released, production is model zero, which no car runs: comparing with it would
prove nothing. The oracle — the same planner with ground-truth perception, on the same
scenarios and seeds — is what a perfect perception engine would do; what the candidate adds to
its at-fault collisions is what perception costs. The first candidate is certified only when
that cost is shown to stay below a margin: the one-sided upper confidence bound (Tango's score
bound, paired by seed) of its at-fault rate minus the oracle's is below
``first_release.max_at_fault_increase``. Evidence too thin to show it is a refusal, not a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiinfra_pipelines.statistics.paired import tango_bound

from .gate_comparison import ScenarioComparison
from .gate_settings import GateLevels
from .gate_slices import difference_figures, pooled_at_fault
from .roles import ROLE_ORACLE


def first_release_test(
    comparisons: Sequence[ScenarioComparison], levels: GateLevels
) -> tuple[dict[str, Any], str | None]:
    """(figures, failure or ``None``) of the non-inferiority test against the oracle."""
    counts = pooled_at_fault(comparisons, ROLE_ORACLE)
    upper = tango_bound(counts, levels.first_release_alpha, upper=True)
    margin = levels.first_release_margin
    figures = {
        **difference_figures(counts, "oracle_at_fault"),
        "first_release": True,
        "first_release_margin": margin,
        "first_release_alpha": levels.first_release_alpha,
        "first_release_upper_bound": round(upper, 6),
    }
    if counts.pairs and upper < margin:
        return figures, None
    return figures, (
        f"first release: at-fault collision rate not shown within +{margin:.3f} of the "
        f"oracle's: difference {counts.difference:+.3f} over {counts.pairs} paired episodes "
        f"({counts.worse} at fault where the oracle was not, {counts.better} the reverse), "
        f"upper {1 - levels.first_release_alpha:.0%} bound {upper:+.3f} >= {margin:.3f}"
    )
