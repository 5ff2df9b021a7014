"""Per-slice metrics across model versions: does each turn of the loop improve the weak slices?

Every ``offline_eval`` stores its candidate's per-slice table as an artifact of the candidate's
MLflow run (``TREND_ARTIFACT``). The trend gathers those records for every registered version up
to the candidate's, and shows metric × slice × version as a markdown table (Dagster metadata)
and a line chart (an MLflow figure). Versions scored on another benchmark version are marked,
since their numbers are not strictly comparable.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .compare import HIGHER_IS_BETTER

TREND_ARTIFACT = "offline_eval/slices.json"
TREND_COLUMNS = ("version", "benchmark_version", "slice", "kind", "frames", "metric", "value")


def trend_record(version: str, benchmark_version: str, candidate: pd.DataFrame) -> dict[str, Any]:
    """What one evaluation contributes to the trend (JSON-ready)."""
    return {
        "version": str(version),
        "benchmark_version": str(benchmark_version),
        "slices": candidate.to_dict(orient="records"),
    }


def slice_trend(records: Iterable[Mapping[str, Any]], metrics: Iterable[str]) -> pd.DataFrame:
    """Long table version × slice × metric, versions in numeric order, one row per value."""
    rows = []
    for record in records:
        for item in record["slices"]:
            for metric in metrics:
                if metric in item:
                    rows.append(
                        {
                            "version": str(record["version"]),
                            "benchmark_version": str(record["benchmark_version"]),
                            "slice": str(item["slice"]),
                            "kind": str(item.get("kind", "slice")),
                            "frames": int(item["frames"]),
                            "metric": metric,
                            "value": float(item[metric]),
                        }
                    )
    table = pd.DataFrame(rows, columns=list(TREND_COLUMNS))
    order = sorted(table["version"].unique(), key=_version_key)
    table["version"] = pd.Categorical(table["version"], categories=order, ordered=True)
    return table.sort_values(["version", "slice"], kind="stable").reset_index(drop=True)


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (1 << 62, version)


def _column(version: str, benchmark: str, latest_benchmark: str) -> str:
    return f"v{version}" if benchmark == latest_benchmark else f"v{version} ({benchmark})"


def trend_markdown(trend: pd.DataFrame, metric: str) -> str:
    """One row per slice, one column per version (the newest benchmark's frames count)."""
    rows = trend[trend["metric"] == metric]
    if rows.empty:
        return f"no {metric} recorded yet\n"
    latest = rows.loc[rows["version"] == rows["version"].max(), "benchmark_version"].iloc[0]
    versions = (
        rows[["version", "benchmark_version"]].drop_duplicates().sort_values("version").to_numpy()
    )
    columns = [_column(str(v), str(b), str(latest)) for v, b in versions]
    better = "higher" if HIGHER_IS_BETTER.get(metric, True) else "lower"
    lines = [
        f"**{metric} per slice and model version** ({better} is better)",
        "",
        "| slice | frames | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    newest = rows[rows["version"] == rows["version"].max()].set_index("slice")["frames"]
    for slice_, group in rows.groupby("slice", sort=False, observed=True):
        values = group.set_index("version", drop=False)["value"]
        cells = [f"{values[v]:.3f}" if v in values.index else "—" for v, _ in versions]
        frames = str(int(newest[slice_])) if slice_ in newest.index else "—"
        lines.append(f"| {slice_} | {frames} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def trend_plot(trend: pd.DataFrame, metric: str, kinds: Iterable[str] = ("slice",)) -> Figure:
    """One line per slice over model versions (plus ``overall`` in black)."""
    rows = trend[(trend["metric"] == metric) & trend["kind"].isin([*kinds, "overall"])]
    if rows.empty:
        raise ValueError(f"no {metric} values in the trend")
    figure = Figure(figsize=(8.0, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    versions = [str(v) for v in rows["version"].cat.categories if v in set(rows["version"])]
    x = {version: i for i, version in enumerate(versions)}
    for slice_, group in rows.groupby("slice", sort=True, observed=True):
        overall = slice_ == "overall"
        axes.plot(
            [x[str(v)] for v in group["version"]],
            group["value"].to_numpy(dtype=float),
            marker="o",
            linewidth=2.5 if overall else 1.0,
            color="black" if overall else None,
            alpha=1.0 if overall else 0.6,
            label=str(slice_),
        )
    better = "higher" if HIGHER_IS_BETTER.get(metric, True) else "lower"
    axes.set_title(f"{metric} per slice across model versions ({better} is better)")
    axes.set_xticks(range(len(versions)), [f"v{v}" for v in versions])
    axes.set_ylabel(metric)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=6, ncol=2, loc="best")
    return figure


def earlier_records(tracking_uri: str, registered_model: str, version: str) -> list[dict[str, Any]]:
    """The trend records of every registered version before ``version`` that has one.

    A version evaluated before the trend existed (or never evaluated) simply has no record.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    records = []
    for found in client.search_model_versions(f"name = '{registered_model}'"):
        if _version_key(str(found.version)) >= _version_key(str(version)) or not found.run_id:
            continue
        # Through this client, so the record comes from this tracking server (MLflow 3's
        # artifacts.load_dict only knows the process-wide tracking URI).
        with tempfile.TemporaryDirectory() as folder:
            try:
                path = client.download_artifacts(found.run_id, TREND_ARTIFACT, folder)
            except (MlflowException, OSError):
                continue
            records.append(json.loads(Path(path).read_text()))
    return records
