"""Budgeted selection vs random vs all-badcases, at equal budget, on the real network.

Per seed: a simulated fleet (highway-env, cached under a temp dir) is split by log into a
frozen benchmark (``datasets.benchmark.freeze_benchmark``: held-out logs per slice), a base
training set and a candidate pool. A base model is trained on the base set; its predictions
on the pool are mined with the production rules (``mining.rules.mine_badcases``) and give the
candidates' confidence and embeddings (``PerceptionNet.embed``). Each strategy then spends the
same budget of frames from the pool:

* ``random``: uniform over the whole candidate pool;
* ``all_badcases``: the mined badcases in a seeded random order, truncated to the budget (what
  the dataset did before: every accepted badcase);
* ``selection``: ``curation.selection.select_frames`` over the mined badcases with the
  ``datasets.yaml`` ``selection`` settings (the budget from ``--budget``);
* ``selection[NAME=VALUE,...]``: the same with overrides, one per ``--variant`` (variants
  share the seed's base model and the other strategies' runs: one more training each).

The default fleet (8 vehicles x 8 episodes, ~3,300 frames, ~130 logs over ~20 slices per
seed) gives a pool of ~1,500 frames and a benchmark with several logs per slice; on a smaller
fleet (``--vehicles 4 --episodes 4``) a slice has one to four logs in all and the strategies
cannot be told apart from the noise of which log lands in the benchmark.

and the real network (``training.yaml`` recipe, Lightning) is trained from the base model's
weights (the loop warm-starts a cycle from the deployed model) for the same epochs on base +
chosen frames, then scored per slice on the benchmark
(``evaluation.predict.slice_metrics``). Worst slice = the lowest occupancy accuracy among the
benchmark's slices with at least ``--min-slice-frames`` frames.

    .venv/bin/python benchmarks/selection.py [--json] [--seeds 3] [--budget 150]
        [--variant weakness_baseline=1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import lightning as L
import numpy as np
import pandas as pd
import torch

from aiinfra_pipelines.curation.selection import SelectionParams, select_frames
from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids, freeze_benchmark
from aiinfra_pipelines.datasets.settings import SelectionSettings
from aiinfra_pipelines.evaluation.predict import slice_metrics
from aiinfra_pipelines.fleet.simulator import drive_fleet
from aiinfra_pipelines.ingest.tables import frames_table, slice_name
from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.mining.rules import mine_badcases
from aiinfra_pipelines.perception.contract import decode_images, images_to_input, perception_spec
from aiinfra_pipelines.perception.engine import outputs_to_predictions
from aiinfra_pipelines.perception.labels import ground_truth_labels
from aiinfra_pipelines.training.datamodule import PerceptionDataModule
from aiinfra_pipelines.training.module import PerceptionModule
from aiinfra_pipelines.training.settings import load_training_config
from aiinfra_pipelines.training.trainer import scratch_trainer

BENCH_KEY = b"s" * 32
STRATEGIES = ("random", "all_badcases", "selection")
warnings.filterwarnings("ignore", message=r".*on_after_batch_transfer.*")
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
FramesForSeed = Callable[[int], pd.DataFrame]
for _name in ("lightning.pytorch", "lightning.fabric"):  # a dozen fits: keep the figures readable
    logging.getLogger(_name).setLevel(logging.ERROR)


def fleet_frames(vehicles: int, episodes: int, seed: int, cache: Path) -> pd.DataFrame:
    """A fleet's frames with slice tags, as ``scene_index`` tags them; cached as parquet."""
    path = cache / f"fleet-v{vehicles}-e{episodes}-s{seed}.parquet"
    if path.exists():
        return pd.read_parquet(path)
    tables = []
    for log in drive_fleet(vehicles, episodes, seed):
        meta = log.metadata
        tables.append(
            frames_table(anonymize_log(log, BENCH_KEY)).assign(
                lighting=meta["lighting"],
                weather=meta["weather"],
                road_type=meta["road_type"],
                slice=slice_name(meta["lighting"], meta["weather"], meta["road_type"]),
                events=",".join(sorted({event.rule for event in log.events})),
            )
        )
    frames = pd.concat(tables, ignore_index=True)
    cache.mkdir(parents=True, exist_ok=True)
    frames.to_parquet(path)
    return frames


def split_pool(
    frames: pd.DataFrame, seed: int, base_share: float
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(base, candidate pool, benchmark), split by log: benchmark logs per slice as the
    dataset layer freezes them, then a seeded ``base_share`` of the other logs as the base."""
    manifest = freeze_benchmark(None, frames, fraction=0.25, seed=seed, min_logs_per_slice=1)
    held = set(benchmark_log_ids(manifest))
    rest = sorted(set(frames["log_id"]) - held)
    rng = np.random.default_rng(seed)
    order = [rest[i] for i in rng.permutation(len(rest))]
    base_logs = set(order[: max(1, round(base_share * len(order)))])
    part = frames["log_id"].isin
    return (
        frames[part(base_logs)].reset_index(drop=True),
        frames[~part(base_logs) & ~part(held)].reset_index(drop=True),
        frames[part(held)].reset_index(drop=True),
    )


def train(
    frames: pd.DataFrame, epochs: int, seed: int, start: torch.nn.Module | None = None
) -> torch.nn.Module:
    """The configured ``PerceptionNet`` trained with the project's Lightning recipe, from
    ``start``'s weights when given (as a loop cycle warm-starts from the deployed model)."""
    L.seed_everything(seed, workers=True, verbose=False)
    config = load_training_config({"max_epochs": epochs})
    spec = perception_spec()
    datamodule = PerceptionDataModule.from_config(frames, frames, config, seed=seed, spec=spec)
    module = PerceptionModule.from_config(spec, config, seed)
    if start is not None:
        module.net.load_state_dict(start.state_dict())
    trainer = scratch_trainer(config, max_epochs=epochs)
    trainer.fit(module, datamodule=datamodule)
    return module.net.eval()


def engine_view(network: torch.nn.Module, frames: pd.DataFrame) -> tuple[Any, np.ndarray]:
    """(Predictions as the deployed engine reports them, embeddings) of ``network``."""
    spec = perception_spec()
    images = decode_images(list(frames["image"]), spec.image_height, spec.image_width)
    logits, gaps, vectors = [], [], []
    with torch.inference_mode():
        for start in range(0, len(images), 128):
            batch = torch.from_numpy(images_to_input(images[start : start + 128]))
            occupancy, gap, embedding = network.forward_with_embedding(batch)
            logits.append(occupancy.numpy())
            gaps.append(gap.numpy())
            vectors.append(embedding.numpy())
    predictions = outputs_to_predictions(np.concatenate(logits), np.concatenate(gaps), spec)
    return predictions, np.concatenate(vectors)


def choose(
    pool: pd.DataFrame,
    base: pd.DataFrame,
    base_model: torch.nn.Module,
    selections: dict[str, SelectionParams],
    seed: int,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Each strategy's chosen pool rows (at most the budget), and mining facts.

    ``selections`` maps a strategy name to its selection parameters: ``"selection"`` (the
    configured settings) and any ``--variant``; all share one budget.
    """
    spec = perception_spec()
    predictions, embeddings = engine_view(base_model, pool)
    labels = ground_truth_labels(pool, spec)
    badcases = mine_badcases(pool, pool, predictions, labels, spec=spec)
    pool = pool.assign(confidence=predictions.confidence.astype(np.float64))
    keys = ["log_id", "frame_index"]
    is_badcase = pool.index.isin(pool.reset_index().merge(badcases[keys], on=keys)["index"])
    budget = selections["selection"].budget_frames
    rng = np.random.default_rng(seed)
    random_rows = np.sort(rng.choice(len(pool), size=min(budget, len(pool)), replace=False))
    bad_rows = np.flatnonzero(is_badcase)
    shuffled = bad_rows[np.random.default_rng(seed).permutation(len(bad_rows))][:budget]
    _, base_embeddings = engine_view(base_model, base)
    base_targets = ground_truth_labels(base, spec)[0].reshape(len(base), -1)
    errors = badcases.drop_duplicates(keys)[[*keys, "disagreement"]]
    candidates = pool[is_badcase].reset_index(drop=True).merge(errors, on=keys, how="left")
    chosen = {"random": pool.iloc[random_rows], "all_badcases": pool.iloc[np.sort(shuffled)]}
    facts: dict[str, Any] = {
        "pool_frames": len(pool),
        "badcases": int(is_badcase.sum()),
        "selection_facts": {},
    }
    for name, params in selections.items():
        selection = select_frames(
            candidates[["log_id", "frame_index", "slice", "confidence", "disagreement"]],
            params,
            seed=seed,
            embeddings=embeddings[is_badcase],
            train_embeddings=base_embeddings,
            train_targets=base_targets,
            train_slices=base["slice"],
        )
        chosen[name] = pool.merge(selection.chosen[["log_id", "frame_index"]], on=keys)
        facts["selection_facts"][name] = _brief(selection.summary)
    return chosen, facts


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "per_reason": summary["per_reason"],
        "per_slice": {k: v["chosen"] for k, v in summary["per_slice"].items()},
        "quotas": summary["quotas"],
        "slice_weakness": summary["slice_weakness"],
        "trained_per_slice": summary.get("trained_per_slice", {}),
    }


def worst_and_overall(metrics: pd.DataFrame, min_frames: int) -> dict[str, Any]:
    """Worst slice (occupancy accuracy, slices with >= ``min_frames`` frames) and overall."""
    slices = metrics[(metrics["kind"] == "slice") & (metrics["frames"] >= min_frames)]
    if slices.empty:
        raise ValueError(f"no benchmark slice has {min_frames} frames: lower --min-slice-frames")
    worst = slices.loc[slices["occupancy_accuracy"].idxmin()]
    overall = metrics.loc[metrics["kind"] == "overall", "occupancy_accuracy"].iloc[0]
    return {
        "worst_slice": str(worst["slice"]),
        "worst_slice_accuracy": float(worst["occupancy_accuracy"]),
        "overall_accuracy": float(overall),
        "per_slice": {
            str(row.slice): round(float(row.occupancy_accuracy), 4)
            for row in slices.itertuples(index=False)
        },
    }


def one_seed(
    frames: pd.DataFrame,
    seed: int,
    selections: dict[str, SelectionParams],
    epochs: int,
    base_share: float,
    min_slice_frames: int,
) -> dict[str, Any]:
    """Every strategy's benchmark figures for one seed's pool."""
    started = time.monotonic()
    base, pool, benchmark = split_pool(frames, seed, base_share)
    base_model = train(base, epochs, seed)
    chosen, facts = choose(pool, base, base_model, selections, seed)
    result: dict[str, Any] = {
        "seed": seed,
        "base_frames": len(base),
        "benchmark_frames": len(benchmark),
        "pool_per_slice": {str(k): int(v) for k, v in pool["slice"].value_counts().items()},
        **facts,
    }
    for name in chosen:
        network = train(
            pd.concat([base, chosen[name]], ignore_index=True), epochs, seed, start=base_model
        )
        figures = worst_and_overall(slice_metrics(network, benchmark), min_slice_frames)
        added = chosen[name]["slice"].astype(str)
        result[name] = {
            "frames_added": len(added),
            "worst_slice_frames_added": int((added == figures["worst_slice"]).sum()),
            **figures,
        }
        print(  # progress: a seed takes minutes per strategy on a laptop CPU
            f"seed {seed} {name}: worst {figures['worst_slice']} "
            f"{figures['worst_slice_accuracy']:.4f} overall {figures['overall_accuracy']:.4f}",
            file=sys.stderr,
            flush=True,
        )
    result["strategies"] = list(chosen)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """One object keyed by strategy: seed means, the most frequent worst slice, per seed."""
    summary: dict[str, Any] = {}
    for name in per_seed[0]["strategies"]:
        runs = [seed_result[name] for seed_result in per_seed]
        worst = [run["worst_slice_accuracy"] for run in runs]
        summary[name] = {
            "worst_slice_accuracy": statistics.fmean(worst),
            "overall_accuracy": statistics.fmean(run["overall_accuracy"] for run in runs),
            "worst_slice": Counter(run["worst_slice"] for run in runs).most_common(1)[0][0],
            "per_seed": [
                {
                    "seed": seed_result["seed"],
                    "pool_frames": seed_result["pool_frames"],
                    "pool_badcases": seed_result["badcases"],
                    **seed_result[name],
                }
                for seed_result in per_seed
            ],
        }
    random_worst = [s["random"]["worst_slice_accuracy"] for s in per_seed]
    for name in per_seed[0]["strategies"]:
        if name.startswith("selection"):
            worst = [s[name]["worst_slice_accuracy"] for s in per_seed]
            summary[name]["worst_slice_wins_over_random"] = sum(
                a > b for a, b in zip(worst, random_worst, strict=True)
            )
            summary[name]["worst_slice_gain_over_random"] = statistics.fmean(
                a - b for a, b in zip(worst, random_worst, strict=True)
            )
    return summary


def run_benchmark(
    seeds: list[int],
    frames_for_seed: FramesForSeed,
    selections: dict[str, SelectionParams],
    *,
    epochs: int,
    base_share: float = 0.4,
    min_slice_frames: int = 10,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary keyed by strategy, the per-seed details with mining facts)."""
    per_seed = [
        one_seed(frames_for_seed(seed), seed, selections, epochs, base_share, min_slice_frames)
        for seed in seeds
    ]
    return summarize(per_seed), per_seed


def _print(summary: dict[str, Any], per_seed: list[dict[str, Any]], seconds: float) -> None:
    for seed_result in per_seed:
        print(
            f"seed {seed_result['seed']}: base {seed_result['base_frames']} frames, pool "
            f"{seed_result['pool_frames']} ({seed_result['badcases']} badcases), benchmark "
            f"{seed_result['benchmark_frames']}; {seed_result['seconds']:.0f} s to train and score"
        )
        for name in seed_result["strategies"]:
            run = seed_result[name]
            print(
                f"  {name:<13} +{run['frames_added']:>4} frames  worst {run['worst_slice']:<24} "
                f"{run['worst_slice_accuracy']:.4f} (+{run['worst_slice_frames_added']} of its "
                f"frames)  overall {run['overall_accuracy']:.4f}"
            )
    print(f"mean over {len(per_seed)} seed(s):")
    for name, row in summary.items():
        print(
            f"  {name:<13} worst-slice accuracy {row['worst_slice_accuracy']:.4f}  overall "
            f"{row['overall_accuracy']:.4f}  (most often worst: {row['worst_slice']})"
        )
    for name, row in summary.items():
        if "worst_slice_wins_over_random" in row:
            print(
                f"{name} beats random on the worst slice in "
                f"{row['worst_slice_wins_over_random']}/{len(per_seed)} seed(s), by "
                f"{row['worst_slice_gain_over_random']:+.4f} on average"
            )
    print(f"{seconds:.0f} s")


def _overrides(pairs: list[str], flag: str = "--param") -> dict[str, float | int]:
    """``["clip_radius=0", ...]`` → ``{"clip_radius": 0}`` (types of ``SelectionParams``)."""
    types = {name: type(value) for name, value in vars(SelectionParams(1)).items()}
    overrides: dict[str, float | int] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types or name == "budget_frames" or not value:
            raise SystemExit(f"{flag} {pair!r}: expected NAME=VALUE, NAME one of {sorted(types)}")
        overrides[name] = types[name](value)
    return overrides


def selections_to_compare(
    params: SelectionParams, variants: list[str]
) -> dict[str, SelectionParams]:
    """``{"selection": params, "selection[a=1,b=2]": params with a=1, b=2, ...}``: variants
    share the seed's base model, pool and the random/all-badcases runs, so they cost one
    training each."""
    selections = {"selection": params}
    for variant in variants:
        pairs = [pair.strip() for pair in variant.split(",") if pair.strip()]
        selections[f"selection[{','.join(pairs)}]"] = replace(
            params, **_overrides(pairs, "--variant")
        )
    return selections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (each its own fleet)")
    parser.add_argument("--budget", type=int, default=150, help="frames added per strategy")
    parser.add_argument("--vehicles", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--base-share", type=float, default=0.4)
    parser.add_argument("--min-slice-frames", type=int, default=10)
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "aiinfra-selection-bench"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--details", type=Path, help="also write per-seed details (JSON) here")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed+N-1"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a datasets.yaml selection setting, e.g. clip_radius=0 (an ablation)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="also run the selection with these overrides (its own key in the output)",
    )
    args = parser.parse_args()
    params = replace(
        SelectionSettings.load().params, budget_frames=args.budget, **_overrides(args.param)
    )
    started = time.monotonic()
    summary, per_seed = run_benchmark(
        list(range(args.first_seed, args.first_seed + args.seeds)),
        lambda seed: fleet_frames(args.vehicles, args.episodes, seed, args.cache),
        selections_to_compare(params, args.variant),
        epochs=args.epochs,
        base_share=args.base_share,
        min_slice_frames=args.min_slice_frames,
    )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary, per_seed, time.monotonic() - started)
    if args.details:
        args.details.write_text(json.dumps(per_seed, indent=2))


if __name__ == "__main__":
    main()
