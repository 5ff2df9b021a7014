"""Re-train a finished demo's latest candidate with training.yaml overrides, and gate it.

The demo's cycle 2 trains on a dataset of its own lake, warm-started from the release rolling
out, and is gated offline against that release. To change the recipe of that step without
re-running two cycles, this script takes a finished demo's ``DAGSTER_HOME``, re-trains on the
lake's latest training dataset with the same warm start (its MLflow run goes to the demo's store
under experiment ``retrain-benchmark``; the demo's model registry is untouched) and prints the
offline gate against the reference release, as ``offline_eval`` would judge it::

    DAGSTER_HOME=/tmp/demo AIINFRA_RESOURCES=/tmp/demo/demo/resources \\
        .venv/bin/python benchmarks/retrain_cycle.py --set warm_start.lr_scale=1.0 [--json]

``--set`` takes the same dotted overrides as ``benchmarks/recipe.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.datasets.assets import BENCHMARK_MANIFEST, TRAINING_LATEST
from aiinfra_pipelines.datasets.loading import load_frames
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.evaluation.compare import compare_with_production
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.release.reference import reference_release
from aiinfra_pipelines.training.resources import MlflowTracking, mlflow_tracking_uri
from aiinfra_pipelines.training.train import train_perception_model
from aiinfra_pipelines.training.warm_start import reference_warm_start

try:  # run as a script: benchmarks/ is on sys.path
    from recipe import parse_overrides
except ImportError:  # imported as benchmarks.retrain_cycle
    from benchmarks.recipe import parse_overrides

EXPERIMENT = "retrain-benchmark"
SHOWN_SLICES = ("overall", "*/*/intersection", "*/*/roundabout", "night/*/*")


def retrain_and_gate(overrides: dict[str, Any]) -> dict[str, Any]:
    """Train on the lake's latest dataset as ``trained_model`` would; gate as ``offline_eval``."""
    import mlflow

    lake = build_lake(load_environment())
    uri = MlflowTracking().uri()
    pointer = lake.get_json_or_none(MAIN_BRANCH, TRAINING_LATEST)
    manifest = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if pointer is None or manifest is None:
        raise SystemExit("no training dataset or benchmark on main: run the demo first")
    rows = lake.get_parquet(pointer["commit"], pointer["rows_key"])
    frames = load_frames(lake, rows, pointer["commit"])
    warm = reference_warm_start(lake, uri, overrides)
    started = time.monotonic()
    result = train_perception_model(
        frames[frames["split"] == "train"],
        frames[frames["split"] == "val"],
        checkpoint_dir=Path(tempfile.mkdtemp(prefix="retrain-")),
        mlflow_tracking_uri=uri,
        experiment=EXPERIMENT,
        run_tags={"dataset_version": pointer["version"]},
        params={"dataset_version": pointer["version"]},
        config=overrides,
        warm_start=warm,
    )
    train_s = time.monotonic() - started
    benchmark_rows = lake.get_parquet(MAIN_BRANCH, manifest["frames_key"])
    benchmark = load_frames(lake, benchmark_rows, MAIN_BRANCH)
    candidate = slice_metrics(result.network, benchmark)
    reference = reference_release(lake)
    production = None
    if reference and reference.get("model_uri"):
        with mlflow_tracking_uri(uri):
            network = mlflow.pytorch.load_model(reference["model_uri"], map_location="cpu")
        production = slice_metrics(network, benchmark)
    comparison = compare_with_production(candidate, production, load_resource_yaml("gates.yaml"))
    by_slice = candidate.set_index("slice")
    reference_by_slice = production.set_index("slice") if production is not None else None
    slices = {}
    for name in SHOWN_SLICES:
        if name not in by_slice.index:
            continue
        entry = {
            "accuracy": round(float(by_slice.loc[name, "occupancy_accuracy"]), 4),
            "lead_gap_mae_m": round(float(by_slice.loc[name, "lead_gap_mae_m"]), 2),
        }
        if reference_by_slice is not None:
            entry["reference_accuracy"] = round(
                float(reference_by_slice.loc[name, "occupancy_accuracy"]), 4
            )
            entry["reference_lead_gap_mae_m"] = round(
                float(reference_by_slice.loc[name, "lead_gap_mae_m"]), 2
            )
        slices[name] = entry
    return {
        "dataset_version": pointer["version"],
        "warm_start_from": result.warm_start_from,
        "epochs": result.epochs_completed,
        "train_s": round(train_s, 1),
        "reference_version": reference["version"] if reference else None,
        "passed": comparison.passed,
        "failures": comparison.failures,
        "slices": slices,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], help="training.yaml key=value")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    figures = retrain_and_gate(parse_overrides(args.set))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{figures['dataset_version']}: {figures['epochs']} epochs in {figures['train_s']} s "
        f"from {figures['warm_start_from']}; offline gate against model version "
        f"{figures['reference_version']}: {'passed' if figures['passed'] else 'refused'}"
    )
    for failure in figures["failures"]:
        print(f"  FAIL {failure}")
    for name, entry in figures["slices"].items():
        print(f"  {name}: {entry}")


if __name__ == "__main__":
    main()
