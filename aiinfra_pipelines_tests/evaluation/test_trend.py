"""Metric × slice × model version: the table and chart that show the loop learning."""

from __future__ import annotations

import pandas as pd
import pytest

from aiinfra_pipelines.evaluation.trend import (
    slice_trend,
    trend_markdown,
    trend_plot,
    trend_record,
)

METRICS = ("occupancy_accuracy", "lead_gap_mae_m")


def _candidate(night: float, overall: float, mae: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "slice": "night/fog/highway",
                "kind": "slice",
                "frames": 40,
                "occupancy_accuracy": night,
                "lead_gap_mae_m": mae,
            },
            {
                "slice": "overall",
                "kind": "overall",
                "frames": 100,
                "occupancy_accuracy": overall,
                "lead_gap_mae_m": mae,
            },
        ]
    )


def test_versions_are_ordered_numerically_and_tabled_per_slice() -> None:
    records = [
        trend_record("10", "benchmark-v0002", _candidate(0.91, 0.95, 3.0)),
        trend_record("2", "benchmark-v0001", _candidate(0.80, 0.90, 6.0)),
        trend_record("9", "benchmark-v0002", _candidate(0.88, 0.94, 4.0)),
    ]
    trend = slice_trend(records, METRICS)
    assert list(trend["version"].cat.categories) == ["2", "9", "10"]
    night = trend[(trend["slice"] == "night/fog/highway") & (trend["metric"] == METRICS[0])]
    assert night["value"].tolist() == pytest.approx([0.80, 0.88, 0.91])

    markdown = trend_markdown(trend, "occupancy_accuracy")
    header = next(line for line in markdown.splitlines() if line.startswith("| slice"))
    # The version scored on an older benchmark says so; the newest benchmark's are plain.
    assert header == "| slice | frames | v2 (benchmark-v0001) | v9 | v10 |"
    assert "| night/fog/highway | 40 | 0.800 | 0.880 | 0.910 |" in markdown
    assert "higher is better" in markdown
    assert "lower is better" in trend_markdown(trend, "lead_gap_mae_m")


def test_a_slice_new_in_a_later_version_shows_a_gap_and_the_plot_draws_every_slice() -> None:
    first = _candidate(0.8, 0.9, 5.0).iloc[[1]]
    records = [
        trend_record("1", "b1", first),
        trend_record("2", "b1", _candidate(0.85, 0.93, 4.0)),
    ]
    trend = slice_trend(records, METRICS)
    assert "| night/fog/highway | 40 | — | 0.850 |" in trend_markdown(trend, "occupancy_accuracy")
    figure = trend_plot(trend, "occupancy_accuracy")
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert sorted(labels) == ["night/fog/highway", "overall"]
    with pytest.raises(ValueError, match="no occupancy_f1"):
        trend_plot(trend, "occupancy_f1")


def test_earlier_records_are_read_from_the_given_tracking_store(tmp_path):
    """Records come from the named MLflow store (a temp sqlite one), only for earlier versions."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from aiinfra_pipelines.evaluation.trend import TREND_ARTIFACT, earlier_records

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("trend", artifact_location=str(tmp_path / "art"))
    client.create_registered_model("perception")
    for version in ("1", "2", "3"):
        run = client.create_run(experiment)
        record = {"version": version, "benchmark_version": "b1", "slices": []}
        client.log_dict(run.info.run_id, record, TREND_ARTIFACT)
        client.create_model_version("perception", f"runs:/{run.info.run_id}/m", run.info.run_id)
    assert mlflow.get_tracking_uri() != uri  # nothing process-wide points at that store

    records = earlier_records(uri, "perception", "3")

    assert sorted(r["version"] for r in records) == ["1", "2"]
