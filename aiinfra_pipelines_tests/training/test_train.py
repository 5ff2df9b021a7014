"""``train_perception_model`` end to end on real fleet frames.

Real learning against no-camera baselines, what MLflow records, bit-identical reruns under a
seed, and a run SIGKILLed mid-training that resumes into the same MLflow run and ends exactly
where an uninterrupted run ends.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from aiinfra_pipelines.config import PROJECT_ROOT, load_resource_yaml
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.training import metrics
from aiinfra_pipelines.training.checkpointing import LOCK_FILE, RUN_ID_FILE, completed_epochs
from aiinfra_pipelines.training.datamodule import PerceptionDataset
from aiinfra_pipelines.training.module import (
    EPOCH_METRICS,
    VAL_ACCURACY,
    VAL_LOSS,
    PerceptionModule,
)
from aiinfra_pipelines.training.train import TrainingResult
from aiinfra_pipelines.training.warm_start import WarmStart
from aiinfra_pipelines_tests.support.killed_runs import kill_when_paused

from .conftest import (
    EXPERIMENT,
    PARAMS,
    SMALL_CONFIG,
    SMALL_EPOCHS,
    TAGS,
    checkpoint_tiers,
    tracking_uri,
)
from .conftest import train_small as _train


def _predict(network: torch.nn.Module, dataset: PerceptionDataset) -> tuple[np.ndarray, ...]:
    with torch.no_grad():
        logits, gap = network(dataset.images.float() / 255.0)
    return torch.sigmoid(logits).numpy(), gap.numpy()


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), f"{name} differs"


# -- real learning + MLflow records (one full training run, default configuration) ---------


@pytest.fixture(scope="module")
def trained(fleet_split, tmp_path_factory) -> tuple[TrainingResult, Path]:
    train, val = fleet_split
    root = tmp_path_factory.mktemp("trained")
    return _train(train, val, root), root


def test_learns_well_beyond_no_camera_baselines(trained, fleet_split, capsys):
    result, _ = trained
    train, val = fleet_split
    assert not set(train["log_id"]) & set(val["log_id"])
    spec = perception_spec()
    dataset = PerceptionDataset(val, spec)
    prob, gap = _predict(result.network, dataset)
    occupancy, lead_gap = dataset.occupancy.numpy(), dataset.lead_gap.numpy()

    accuracy = metrics.occupancy_accuracy(prob, occupancy)
    baseline = metrics.occupancy_majority_baseline_accuracy(occupancy)  # per (lane, bin) cell
    mae = metrics.lead_gap_mae_m(gap, lead_gap, spec.max_range_m)
    mean_mae = metrics.lead_gap_mean_baseline_mae_m(lead_gap, spec.max_range_m)
    with capsys.disabled():
        print(
            f"\nval occupancy accuracy {accuracy:.3f} (per-cell majority baseline {baseline:.3f},"
            f" global {metrics.occupancy_majority_baseline_accuracy(occupancy, False):.3f}),"
            f" F1 {metrics.occupancy_f1(prob, occupancy):.3f}; lead-gap MAE {mae:.1f} m"
            f" (mean predictor {mean_mae:.1f} m); {len(train)} train / {len(val)} val frames"
        )
        for name, rows in val.groupby("slice").indices.items():
            print(
                f"  {name:24s} n={len(rows):3d}"
                f" acc={metrics.occupancy_accuracy(prob[rows], occupancy[rows]):.3f}"
                f" (baseline {metrics.occupancy_majority_baseline_accuracy(occupancy[rows]):.3f})"
                f" f1={metrics.occupancy_f1(prob[rows], occupancy[rows]):.3f}"
                f" gap_mae={metrics.lead_gap_mae_m(gap[rows], lead_gap[rows], 75.0):.1f} m"
            )

    assert result.metrics[VAL_ACCURACY] == pytest.approx(accuracy, abs=1e-6)
    assert accuracy >= baseline + 0.05
    assert mae <= 0.9 * mean_mae
    assert result.epochs_completed == load_resource_yaml("training.yaml")["max_epochs"]
    assert result.resumed_from_epoch is None


def test_mlflow_records_params_tags_history_checkpoint_and_a_loadable_model(
    trained, fleet_split, monkeypatch
):
    result, root = trained
    client = MlflowClient(tracking_uri=tracking_uri(root))
    run = client.get_run(result.mlflow_run_id)
    config = load_resource_yaml("training.yaml")

    assert run.info.status == "FINISHED"
    assert run.data.params["dataset_commit_id"] == PARAMS["dataset_commit_id"]
    assert run.data.params["code_version"] == PARAMS["code_version"]
    assert run.data.params["optimizer.lr"] == str(config["optimizer"]["lr"])
    assert run.data.params["data.batch_size"] == str(config["data"]["batch_size"])
    assert run.data.tags["dagster_run_id"] == TAGS["dagster_run_id"]
    assert (root / "checkpoints" / RUN_ID_FILE).read_text() == result.mlflow_run_id

    epochs = list(range(result.epochs_completed))
    for name in EPOCH_METRICS:
        history = client.get_metric_history(result.mlflow_run_id, name)
        assert sorted(point.step for point in history) == epochs, name
    last_val = max(
        client.get_metric_history(result.mlflow_run_id, VAL_ACCURACY), key=lambda m: m.step
    )
    assert last_val.value == pytest.approx(result.metrics[VAL_ACCURACY], abs=1e-6)
    artifacts = [item.path for item in client.list_artifacts(result.mlflow_run_id, "checkpoints")]
    assert artifacts == ["checkpoints/last.ckpt"]

    # The checkpoint alone rebuilds the module (all hyperparameters saved with it).
    restored = PerceptionModule.load_from_checkpoint(result.checkpoint_path, map_location="cpu")
    _assert_same_weights(restored.net, result.network)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(root))
    dataset = PerceptionDataset(fleet_split[1].iloc[:64], perception_spec())
    expected = _predict(result.network, dataset)
    for uri in (result.model_uri, f"runs:/{result.mlflow_run_id}/model"):
        loaded = mlflow.pytorch.load_model(uri).eval()
        for got, want in zip(_predict(loaded, dataset), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# -- determinism and resume (small runs) -----------------------------------------------------


def test_same_seed_and_data_give_identical_weights(uninterrupted, small_split, tmp_path):
    train, val = small_split
    again = _train(train, val, tmp_path, config=SMALL_CONFIG, max_epochs=SMALL_EPOCHS, seed=0)

    _assert_same_weights(again.network, uninterrupted.network)
    for name, value in uninterrupted.metrics.items():
        assert again.metrics[name] == pytest.approx(value, abs=1e-6)
    assert again.mlflow_run_id != uninterrupted.mlflow_run_id  # separate runs, same result


KILL_AFTER_EPOCHS = 2
HANG_GUARD_S = 1800  # only a wedged child gets here; the kill itself waits on no clock


def test_run_killed_mid_training_resumes_into_the_same_run_and_finishes_identically(
    uninterrupted, small_split, tmp_path
):
    train, val = small_split
    checkpoint_dir = tmp_path / "checkpoints"
    train.to_pickle(tmp_path / "train.pkl")
    val.to_pickle(tmp_path / "val.pkl")
    job = {
        "train": str(tmp_path / "train.pkl"),
        "val": str(tmp_path / "val.pkl"),
        "checkpoint_dir": str(checkpoint_dir),
        "tracking_uri": tracking_uri(tmp_path),
        "experiment": EXPERIMENT,
        "run_tags": TAGS,
        "params": PARAMS,
        "config": SMALL_CONFIG,
        "max_epochs": SMALL_EPOCHS,
        "seed": 0,
        # The child stops in the first step after this many epochs, checkpointed: the kill
        # lands mid-training after exactly these epochs, not after however many a clock allowed.
        "pause_after_epochs": KILL_AFTER_EPOCHS,
        "paused_marker": str(tmp_path / "paused"),
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    log = tmp_path / "child.log"
    with log.open("wb") as output:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aiinfra_pipelines_tests.training._resume_worker",
                str(tmp_path / "job.json"),
            ],
            cwd=PROJECT_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill takes its workers too
        )
        kill_when_paused(child, tmp_path / "paused", log, HANG_GUARD_S)
    assert child.returncode == -signal.SIGKILL
    killed_after = completed_epochs(checkpoint_dir / "last.ckpt")
    assert (tmp_path / "paused").read_text() == str(KILL_AFTER_EPOCHS)  # 0-based: the 3rd epoch
    assert killed_after == KILL_AFTER_EPOCHS < SMALL_EPOCHS, "the kill lands mid-training"
    run_id = (checkpoint_dir / RUN_ID_FILE).read_text()
    # Tiers (SMALL_CONFIG): the killed process had already demoted epoch 0 to weights only.
    assert checkpoint_tiers(checkpoint_dir) == {
        "epoch=000.ckpt": "weights-only",
        "epoch=001.ckpt": "full",
        "last.ckpt": "full",
    }

    resumed = _train(train, val, tmp_path, config=SMALL_CONFIG, max_epochs=SMALL_EPOCHS, seed=0)

    assert resumed.resumed_from_epoch == killed_after
    assert resumed.epochs_completed == uninterrupted.epochs_completed == SMALL_EPOCHS
    assert resumed.mlflow_run_id == run_id
    client = MlflowClient(tracking_uri=tracking_uri(tmp_path))
    assert len(client.search_runs([resumed.experiment_id])) == 1
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["aiinfra.resumed_from_epoch"] == str(killed_after)
    for name in (VAL_LOSS, VAL_ACCURACY):
        steps = {point.step for point in client.get_metric_history(run_id, name)}
        assert steps == set(range(SMALL_EPOCHS)), name
    # Same data order, augmentation draws and LR curve as without the kill: same weights,
    # with the older checkpoints demoted and pruned in both processes along the way.
    _assert_same_weights(resumed.network, uninterrupted.network)
    assert checkpoint_tiers(checkpoint_dir) == {
        "epoch=001.ckpt": "weights-only",
        "epoch=002.ckpt": "weights-only",
        "epoch=003.ckpt": "full",
        "last.ckpt": "full",
    }

    # Calling again after completion trains nothing and logs no second model.
    again = _train(train, val, tmp_path, config=SMALL_CONFIG, max_epochs=SMALL_EPOCHS, seed=0)
    assert again.resumed_from_epoch == again.epochs_completed == SMALL_EPOCHS
    assert (again.mlflow_run_id, again.model_uri) == (run_id, resumed.model_uri)
    _assert_same_weights(again.network, resumed.network)


# -- refusals ----------------------------------------------------------------------------------


def test_a_second_process_training_into_the_same_directory_is_refused(small_split, tmp_path):
    checkpoint_dir = tmp_path / "checkpoints"
    checkpoint_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            "handle = open(sys.argv[1], 'a+b')\n"
            "fcntl.lockf(handle, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
            str(checkpoint_dir / LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(RuntimeError, match="another process is training"):
            _train(*small_split, tmp_path, config=SMALL_CONFIG, max_epochs=1)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert not (checkpoint_dir / RUN_ID_FILE).exists()


def _nan_label(frames: pd.DataFrame) -> pd.DataFrame:
    broken = frames.reset_index(drop=True).copy()
    broken.at[0, "ground_truth"] = json.dumps(
        [{"vehicle_id": 9, "x": float("nan"), "y": 0.0, "vx": 0.0, "vy": 0.0, "lane_offset": 0}]
    )
    return broken


def _other_size(frames: pd.DataFrame) -> pd.DataFrame:
    return frames.assign(image_width=80, image=[bytes(64 * 80 * 3)] * len(frames))


@pytest.mark.parametrize(
    ("damage_train", "damage_val", "message"),
    [
        (lambda f: f.iloc[0:0], None, "train_frames is empty"),
        (None, _other_size, "val_frames: mismatched image sizes"),
        (_nan_label, None, "train_frames: NaN/invalid ground truth"),
        (None, "share-a-log", "share 1 log"),
    ],
    ids=["empty-train", "image-size", "nan-label", "leaky-split"],
)
def test_bad_input_fails_before_any_run_or_checkpoint_exists(
    small_split, tmp_path, damage_train, damage_val, message
):
    train, val = small_split
    if damage_train is not None:
        train = damage_train(train)
    if damage_val == "share-a-log":
        val = pd.concat([val, train[train["log_id"] == train["log_id"].iloc[0]]])
    elif damage_val is not None:
        val = damage_val(val)

    with pytest.raises(ValueError, match=message):
        _train(train, val, tmp_path, config=SMALL_CONFIG, max_epochs=1)
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "mlflow.db").exists()


def test_the_environment_overrides_the_trainer_section(monkeypatch, tmp_path):
    """prod trains on the GPU pool with mixed precision; local keeps training.yaml as it is."""
    from aiinfra_pipelines.training.assets import environment_training_overrides
    from aiinfra_pipelines.training.settings import load_training_config

    monkeypatch.setenv("AIINFRA_ENV", "local")
    assert environment_training_overrides() == {}
    monkeypatch.setenv("AIINFRA_ENV", "prod")
    prod = load_training_config(environment_training_overrides())
    assert prod["trainer"]["accelerator"] == "gpu" and prod["trainer"]["precision"] == "16-mixed"
    assert prod["trainer"]["deterministic"] == load_training_config()["trainer"]["deterministic"]


# -- warm start from a released model ---------------------------------------------------------


def test_a_warm_start_fine_tunes_released_weights_and_other_architectures_start_cold(
    uninterrupted, small_split, tmp_path
):
    """Starts from the released weights (warm_start.max_epochs at a scaled learning rate,
    lineage in MLflow); weights of another architecture mean the full cold recipe."""
    train, val = small_split
    config = {**SMALL_CONFIG, "warm_start": {"max_epochs": 1, "lr_scale": 0.5}}
    source = "models:/perception/1 (model version 1, rollout)"
    warm = _train(
        train,
        val,
        tmp_path / "warm",
        config=config,
        warm_start=WarmStart(uninterrupted.network.state_dict(), source),
    )
    assert warm.epochs_completed == 1
    params = MlflowClient(tracking_uri(tmp_path / "warm")).get_run(warm.mlflow_run_id).data.params
    assert params["warm_start_from"] == source
    assert warm.warm_start_from == source
    assert float(params["optimizer.lr"]) == pytest.approx(
        0.5 * float(load_resource_yaml("training.yaml")["optimizer"]["lr"])
    )

    narrow = PerceptionModule.from_config(
        perception_spec(),
        {**load_resource_yaml("training.yaml"), "model": {"width": 8, "hidden": 32}},
        seed=0,
    ).net
    cold = _train(
        train,
        val,
        tmp_path / "cold",
        config=config,
        warm_start=WarmStart(narrow.state_dict(), "models:/perception/9"),
        max_epochs=1,  # the cold recipe's 18 epochs would only cost time here
    )
    params = MlflowClient(tracking_uri(tmp_path / "cold")).get_run(cold.mlflow_run_id).data.params
    assert params["warm_start_from"] == "none"
    assert cold.warm_start_from == "none"
    assert float(params["optimizer.lr"]) == pytest.approx(
        float(load_resource_yaml("training.yaml")["optimizer"]["lr"])
    )
    assert cold.epochs_completed == 1
    # One epoch from the released weights ends far closer to them than one from scratch.
    released = uninterrupted.network.state_dict()

    def distance(network) -> float:
        weights = network.state_dict()
        return sum(
            float(((weights[name].float() - value.float()) ** 2).sum())
            for name, value in released.items()
            if value.is_floating_point()
        )

    assert distance(warm.network) < 0.25 * distance(cold.network)
