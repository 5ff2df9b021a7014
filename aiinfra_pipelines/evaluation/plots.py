"""Bar charts of the comparison table, for ``mlflow.log_figure`` and the Dagster UI.

Figures are built with the object-oriented API on an Agg canvas, never ``pyplot``: no global
figure state leaks between asset runs and no display is needed on a headless worker.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .compare import HIGHER_IS_BETTER

CANDIDATE_COLOR = "#1f77b4"
PRODUCTION_COLOR = "#aaaaaa"
FAIL_COLOR = "#d62728"


def slice_metric_plot(
    comparison_table: pd.DataFrame,
    metric: str,
    *,
    kinds: Iterable[str] | None = None,
) -> Figure:
    """Candidate vs production bars for ``metric``, one group per slice of the table.

    ``kinds`` restricts the groups (e.g. ``["slice"]`` for the scenario slices only; default:
    every row, aggregates and ``overall`` included). Failed gated slices get a red outline,
    ungated ones are drawn faded, and a missing production value draws no production bar.
    """
    rows = comparison_table.loc[comparison_table["metric"] == metric]
    if kinds is not None:
        rows = rows.loc[rows["kind"].isin(list(kinds))]
    if rows.empty:
        raise ValueError(f"no rows for metric {metric!r} in the comparison table")
    x = np.arange(len(rows))
    width = 0.4
    figure = Figure(figsize=(max(6.0, 0.55 * len(rows) + 2.0), 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    gated = rows["gated"].to_numpy(dtype=bool)
    failed = gated & ~rows["passed"].to_numpy(dtype=bool)
    alphas = np.where(gated | ~rows["production"].notna().to_numpy(), 1.0, 0.45)
    candidate_bars = axes.bar(
        x - width / 2,
        rows["candidate"].to_numpy(dtype=float),
        width,
        label="candidate",
        color=CANDIDATE_COLOR,
    )
    production = rows["production"].to_numpy(dtype=float)
    production_bars = axes.bar(
        x + width / 2, np.nan_to_num(production), width, label="production", color=PRODUCTION_COLOR
    )
    for bar, value in zip(production_bars, production, strict=True):
        bar.set_visible(bool(np.isfinite(value)))
    for bar, alpha, is_failed in zip(candidate_bars, alphas, failed, strict=True):
        bar.set_alpha(float(alpha))
        if is_failed:
            bar.set_edgecolor(FAIL_COLOR)
            bar.set_linewidth(2.0)
    better = "higher" if HIGHER_IS_BETTER.get(metric, True) else "lower"
    axes.set_title(f"{metric} per slice ({better} is better; red outline = over budget)")
    axes.set_ylabel(metric)
    axes.set_xticks(x, rows["slice"].tolist(), rotation=60, ha="right", fontsize=8)
    axes.legend(loc="best")
    axes.grid(axis="y", alpha=0.3)
    return figure
