"""Comparison plots: a Matplotlib Figure with one candidate/production bar pair per slice."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from matplotlib.figure import Figure

from aiinfra_pipelines.evaluation.compare import compare_with_production
from aiinfra_pipelines.evaluation.plots import FAIL_COLOR, slice_metric_plot

GATES = {"offline": {"min_slice_frames": 20, "budgets": {"occupancy_accuracy": 0.03}}}
SLICES = ["day/clear/highway", "night/rain/merge", "night/fog/roundabout"]


def _comparison(with_production: bool = True):
    def table(values: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "slice": [*SLICES, "overall"],
                "kind": ["slice"] * 3 + ["overall"],
                "frames": [50, 50, 10, 110],
                "occupancy_accuracy": values,
            }
        )

    production = table([0.9, 0.9, 0.9, 0.9]) if with_production else None
    return compare_with_production(table([0.91, 0.5, 0.4, 0.7]), production, GATES)


def test_one_bar_group_per_slice_with_the_table_values() -> None:
    comparison = _comparison()
    figure = slice_metric_plot(comparison.table, "occupancy_accuracy")

    assert isinstance(figure, Figure)
    [axes] = figure.axes
    labels = [tick.get_text() for tick in axes.get_xticklabels()]
    assert labels == [*SLICES, "overall"]
    candidate, production = axes.containers
    assert [bar.get_height() for bar in candidate] == pytest.approx([0.91, 0.5, 0.4, 0.7])
    assert [bar.get_height() for bar in production] == pytest.approx([0.9] * 4)
    assert all(bar.get_visible() for bar in production)
    # The gated, failed night/rain/merge bar is outlined; the ungated small slice is not.
    outlined = [bar.get_linewidth() == 2.0 for bar in candidate]
    assert outlined == [False, True, False, True]
    assert candidate[1].get_edgecolor()[:3] == pytest.approx((214 / 255, 39 / 255, 40 / 255))
    assert FAIL_COLOR == "#d62728"

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")  # what mlflow.log_figure does, headless
    assert buffer.getvalue().startswith(b"\x89PNG")


def test_kinds_filter_and_no_production() -> None:
    comparison = _comparison(with_production=False)
    figure = slice_metric_plot(comparison.table, "occupancy_accuracy", kinds=["slice"])
    [axes] = figure.axes
    assert [tick.get_text() for tick in axes.get_xticklabels()] == SLICES
    candidate, production = axes.containers
    assert [bar.get_height() for bar in candidate] == pytest.approx([0.91, 0.5, 0.4])
    assert not any(bar.get_visible() for bar in production)  # nothing to compare against
    with pytest.raises(ValueError, match="no rows for metric"):
        slice_metric_plot(comparison.table, "lead_gap_mae_m")
