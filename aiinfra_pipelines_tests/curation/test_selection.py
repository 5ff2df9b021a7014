"""Budgeted selection: the greedy algorithm on hand-made embeddings, the dataset/sensor
agreement on a real mined lake, and the benchmark script's core on a tiny configuration."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.curation.selection import (
    REASON_CONTEXT,
    REASON_QUOTA,
    SelectionParams,
    ensemble_disagreement,
    k_center_greedy,
    select_frames,
)


def _candidates(slices: list[str], logs: list[str] | None = None) -> pd.DataFrame:
    n = len(slices)
    logs = logs or [f"log{i}" for i in range(n)]
    frame_index = pd.Series(logs).groupby(logs).cumcount().to_numpy()
    return pd.DataFrame(
        {
            "log_id": logs,
            "frame_index": frame_index,
            "slice": slices,
            "confidence": np.linspace(0.9, 0.1, n),
        }
    )


def test_k_center_picks_far_points_first_and_ignores_what_training_covers():
    # Two tight clusters of candidates and one lone point; training already covers cluster A.
    cluster_a = np.array([[1.0, 0.0, 0.0], [0.99, 0.05, 0.0], [0.98, 0.0, 0.05]])
    cluster_b = np.array([[0.0, 1.0, 0.0], [0.05, 0.99, 0.0]])
    lone = np.array([[0.0, 0.0, 1.0]])
    points = np.vstack([cluster_a, cluster_b, lone])
    order = k_center_greedy(points, covered=np.array([[1.0, 0.01, 0.0]]), k=3)
    # One pick per uncovered region before any second pick inside one; cluster A, near the
    # training frame, comes last.
    assert set(order[:2]) == {3, 5} or set(order[:2]) == {4, 5}
    assert not set(order[:2]) & {0, 1, 2}
    unseeded = k_center_greedy(points, covered=None, k=3)
    assert {0, 1, 2} & set(unseeded)  # without the training set, cluster A is a region too


def test_budget_is_respected_and_everything_is_taken_when_it_fits():
    candidates = _candidates(["a"] * 6 + ["b"] * 4)
    params = SelectionParams(budget_frames=4)
    assert len(select_frames(candidates, params, seed=0).chosen) == 4
    roomy = select_frames(candidates, SelectionParams(budget_frames=50), seed=0)
    assert len(roomy.chosen) == len(candidates)
    assert roomy.summary["candidates"] == 10 and roomy.summary["chosen"] == 10


def test_without_embeddings_the_least_confident_frames_win_and_the_summary_says_so():
    candidates = _candidates(["a"] * 10)  # confidence falls along the rows
    selection = select_frames(candidates, SelectionParams(budget_frames=3), seed=0)
    assert sorted(selection.chosen["log_id"]) == ["log7", "log8", "log9"]
    assert not selection.summary["uses_embeddings"]
    assert "no embeddings" in selection.summary["notes"][0]


def test_slice_quotas_hold_even_for_the_most_confident_slice():
    # Slice "rare" is the most confident: by score alone it would get nothing.
    candidates = _candidates(["rare"] * 5 + ["common"] * 15)
    plain = select_frames(candidates, SelectionParams(budget_frames=10), seed=0)
    assert (plain.chosen["slice"] == "rare").sum() == 0
    quota = select_frames(
        candidates, SelectionParams(budget_frames=10, min_slice_share=0.3), seed=0
    )
    assert (quota.chosen["slice"] == "rare").sum() == 3  # ceil(0.3 x 10)
    assert len(quota.chosen) == 10
    rare_scores = quota.scores[quota.scores["chosen"] & (quota.scores["slice"] == "rare")]
    assert set(rare_scores["reason"]) == {REASON_QUOTA}
    assert quota.summary["quotas"] == {"common": 3, "rare": 3}
    assert quota.summary["per_slice"]["rare"] == {"candidates": 5, "chosen": 3}


def test_weak_slices_get_budget_in_proportion_to_the_engines_error_on_them():
    # "weak" is confidently wrong (low uncertainty, high label error): per-frame scores alone
    # would spend nothing there; its measured error earns it the weakness quota.
    candidates = _candidates(["weak"] * 10 + ["fine"] * 20).assign(
        confidence=[0.95] * 10 + list(np.linspace(0.6, 0.1, 20)),
        disagreement=[0.3] * 10 + [0.1] * 20,
    )
    plain = select_frames(candidates, SelectionParams(budget_frames=8), seed=0)
    assert (plain.chosen["slice"] == "weak").sum() == 0
    params = SelectionParams(budget_frames=8, weak_slice_share=0.5)
    weighted = select_frames(candidates, params, seed=0)
    # 4 frames split 0.3 : 0.1 by error → 3 to "weak", 1 to "fine"
    assert weighted.summary["quotas"] == {"fine": 1, "weak": 3}
    assert (weighted.chosen["slice"] == "weak").sum() == 3 and len(weighted.chosen) == 8
    assert weighted.summary["slice_weakness"]["basis"] == "label_error"
    # Without label errors the weakness is the mean uncertainty, and "fine" is the unsure one.
    unlabelled = select_frames(candidates.drop(columns="disagreement"), params, seed=0)
    assert unlabelled.summary["slice_weakness"]["basis"] == "uncertainty"
    assert (unlabelled.chosen["slice"] == "weak").sum() < 3


def test_a_weakness_baseline_gives_the_weak_share_to_slices_worse_than_average():
    # Errors 0.30 / 0.15 / 0.15 (mean 0.20): proportionally the weak share goes 2 : 1 : 1;
    # above the mean only "worst" is weaker than average, so it gets all of it.
    slices = ["worst"] * 10 + ["a"] * 10 + ["b"] * 10
    candidates = _candidates(slices).assign(confidence=0.5, disagreement=[0.30] * 10 + [0.15] * 20)
    proportional = SelectionParams(budget_frames=8, weak_slice_share=0.5)
    assert select_frames(candidates, proportional, seed=0).summary["quotas"] == {
        "a": 1,
        "b": 1,
        "worst": 2,
    }
    above_mean = replace(proportional, weakness_baseline=1.0)
    selection = select_frames(candidates, above_mean, seed=0)
    assert selection.summary["quotas"] == {"worst": 4}
    assert (selection.chosen["slice"] == "worst").sum() >= 4
    # Equal errors leave nothing above the mean: no weakness quotas at all.
    even = candidates.assign(disagreement=0.2)
    assert select_frames(even, above_mean, seed=0).summary["quotas"] == {}


def test_clip_context_brings_neighbours_counted_against_the_budget():
    logs = ["clip"] * 10 + ["other"] * 10
    candidates = _candidates(["s"] * 20, logs)
    candidates["confidence"] = 0.9
    candidates.loc[5, "confidence"] = 0.1  # the hard moment: clip frame 5
    selection = select_frames(candidates, SelectionParams(budget_frames=5, clip_radius=2), seed=0)
    chosen = selection.scores[selection.scores["chosen"]]
    assert len(chosen) == 5
    first = chosen[chosen["pick_order"] == 0]
    assert sorted(first["frame_index"]) == [3, 4, 5, 6, 7]
    assert set(first.loc[first["frame_index"] != 5, "reason"]) == {REASON_CONTEXT}
    assert set(first.loc[first["frame_index"] != 5, "context_of"]) == {"clip#5"}
    # A budget smaller than the clip takes the nearest neighbours first.
    tight = select_frames(candidates, SelectionParams(budget_frames=3, clip_radius=2), seed=0)
    assert sorted(tight.chosen["frame_index"]) == [4, 5, 6]


def test_diversity_spreads_picks_over_regions_the_training_set_lacks():
    rng = np.random.default_rng(0)
    # 20 candidates near direction e0 (well covered by training), 5 near e1, 5 near e2.
    centers = np.eye(3)
    labels = np.array([0] * 20 + [1] * 5 + [2] * 5)
    embeddings = centers[labels] + 0.05 * rng.normal(size=(30, 3))
    candidates = _candidates(["s"] * 30)
    candidates["confidence"] = 0.5  # uncertainty ties: diversity decides
    train = centers[[0] * 10] + 0.05 * rng.normal(size=(10, 3))
    selection = select_frames(
        candidates,
        SelectionParams(budget_frames=2, diversity_weight=1.0),
        seed=0,
        embeddings=embeddings,
        train_embeddings=train,
    )
    assert sorted(labels[selection.scores.index[selection.scores["chosen"]]]) == [1, 2]


def test_ensemble_disagrees_off_the_training_distribution():
    rng = np.random.default_rng(1)
    train = rng.normal(size=(200, 4)) * [1.0, 1.0, 0.01, 0.01]  # varies in two directions only
    targets = (train[:, :1] > 0).astype(float)
    inside = rng.normal(size=(50, 4)) * [1.0, 1.0, 0.01, 0.01]
    outside = rng.normal(size=(50, 4)) * [1.0, 1.0, 3.0, 3.0]
    spread = ensemble_disagreement(
        train, targets, np.vstack([inside, outside]), members=8, ridge=1.0, seed=0
    )
    assert spread[50:].mean() > 2 * spread[:50].mean()


def test_selection_is_deterministic_given_the_seed():
    rng = np.random.default_rng(2)
    candidates = _candidates([f"s{i % 3}" for i in range(40)])
    candidates["confidence"] = 0.5  # ties everywhere: only the seeded tie-break decides
    embeddings = rng.normal(size=(40, 8))
    train = rng.normal(size=(30, 8))
    targets = rng.integers(0, 2, size=(30, 6)).astype(float)
    params = SelectionParams(budget_frames=12, min_slice_share=0.2, clip_radius=1)

    def run(seed: int) -> pd.DataFrame:
        return select_frames(
            candidates,
            params,
            seed=seed,
            embeddings=embeddings,
            train_embeddings=train,
            train_targets=targets,
        ).scores

    pd.testing.assert_frame_equal(run(3), run(3))
    assert run(3)["ensemble_disagreement"].notna().all()
    no_spread = select_frames(
        candidates, params, seed=3, embeddings=np.zeros((40, 8)), train_embeddings=None
    )
    other = select_frames(
        candidates, params, seed=4, embeddings=np.zeros((40, 8)), train_embeddings=None
    )
    assert not no_spread.chosen.equals(other.chosen)  # the seed does matter on ties


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="diversity_weight"):
        SelectionParams(budget_frames=3, diversity_weight=2.0)
    candidates = _candidates(["a"] * 3)
    with pytest.raises(ValueError, match="row-aligned"):
        select_frames(candidates, SelectionParams(3), seed=0, embeddings=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="confidence"):
        select_frames(candidates.drop(columns="confidence"), SelectionParams(3), seed=0)


# -- the dataset and the retraining sensor agree on a real lake --------------------------------

BUDGET = 8


@pytest.fixture(scope="module")
def budgeted_lake(tmp_path_factory):
    """Three synthetic logs ingested and mined by model zero (every frame a badcase: 36 of
    them, more than the budget of 8), under a resources copy with that budget: (instance,
    lake, resources)."""
    import dagster as dg

    from aiinfra_pipelines.lake.local import LocalLake
    from aiinfra_pipelines.logs.synthetic import make_synthetic_log
    from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
    from aiinfra_pipelines_tests.support.config_copies import resources_with
    from aiinfra_pipelines_tests.support.loop_runs import ingest_and_mine, loop_resources

    workdir = tmp_path_factory.mktemp("budgeted")
    overlays = {
        "datasets.yaml": {
            "selection": {"budget_frames": BUDGET, "clip_radius": 1, "min_slice_share": 0.25}
        },
        "loop.yaml": {"retraining": {"min_unseen_badcases": 3}},
    }
    with resources_with(workdir / "resources", overlays), pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(workdir))
        lake = LocalLake(root=str(workdir / "lake"))
        lake.ensure_repository()
        resources = loop_resources(lake, workdir)
        logs = [make_synthetic_log(n_frames=12, seed=seed, **CAMERA_SIZE) for seed in (1, 2, 3)]
        (workdir / "home").mkdir()
        with dg.instance_for_test(temp_dir=str(workdir / "home")) as instance:
            ingest_and_mine(instance, resources, "budgeted", logs)
            yield instance, lake, resources


def test_sensor_and_dataset_agree_on_the_budgeted_selection(budgeted_lake):
    import dagster as dg

    from aiinfra_pipelines.datasets.selection import (
        TRAINING_LATEST,
        configured_training_rows,
        unseen_badcases,
    )
    from aiinfra_pipelines.lake.io_manager import read_asset_partitions
    from aiinfra_pipelines.lake.layout import MAIN_BRANCH
    from aiinfra_pipelines.sensors.retrain_sensor import badcase_fingerprint, retraining_sensor
    from aiinfra_pipelines_tests.support.loop_runs import all_assets_and_checks

    instance, lake, resources = budgeted_lake

    def cut(asset: str) -> dg.ExecuteInProcessResult:
        result = dg.materialize(
            all_assets_and_checks(),
            selection=dg.AssetSelection.assets(asset),
            instance=instance,
            resources=resources,
        )
        assert result.success
        return result

    # The benchmark is frozen first: before it exists the sensor also counts frames of logs the
    # first benchmark will hold out (a pre-existing approximation, not the budget's business).
    cut("benchmark_set")
    mined = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    rows, qc = configured_training_rows(lake)
    assert qc["selection"]["binding"] and qc["selection"]["candidates"] > BUDGET
    assert len(mined) > qc["selection"]["candidates"]  # benchmark frames are no candidates
    unseen = unseen_badcases(lake)
    assert len(unseen) == BUDGET  # the budget's choice, not every accepted badcase
    assert badcase_fingerprint(unseen) == badcase_fingerprint(rows[rows["badcase"]])

    context = dg.build_sensor_context(instance=instance, resources={"lake": lake})
    (request,) = retraining_sensor(context).run_requests
    assert request.run_key == f"retrain-badcases-{badcase_fingerprint(unseen)}"

    result = cut("training_dataset")
    summary = (
        result.asset_materializations_for_node("training_dataset")[0].metadata["selection"].value
    )
    assert summary["binding"] and summary["budget_frames"] == BUDGET
    assert summary["uses_embeddings"], summary["notes"]
    # Model zero marks every frame a badcase: no base frames for the ensemble to learn from.
    assert not summary["uses_ensemble"] and "no ensemble" in summary["notes"][0]
    assert sum(s["chosen"] for s in summary["per_slice"].values()) == BUDGET
    pointer = lake.get_json(MAIN_BRANCH, TRAINING_LATEST)
    dataset = lake.get_parquet(pointer["commit"], pointer["rows_key"])
    assert badcase_fingerprint(dataset[dataset["badcase"]]) == badcase_fingerprint(unseen)
    # The dataset took exactly what the sensor counted: nothing is left "unseen", no retraining
    # — though most accepted badcases were left out by the budget.
    assert unseen_badcases(lake).empty
    assert isinstance(retraining_sensor(context), dg.SkipReason)


# -- the benchmark script's core, on a tiny configuration --------------------------------------


def test_benchmark_core_compares_strategies_at_equal_budget(monkeypatch):
    import importlib.util
    from pathlib import Path

    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    path = Path(__file__).parents[2] / "benchmarks" / "selection.py"
    spec = importlib.util.spec_from_file_location("selection_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    frames = fleet_frames(4, 2, 0)
    selections = bench.selections_to_compare(
        SelectionParams(budget_frames=40, clip_radius=1), ["weakness_baseline=1, clip_radius=0"]
    )
    variant = "selection[weakness_baseline=1,clip_radius=0]"
    assert selections[variant] == SelectionParams(40, weakness_baseline=1.0, clip_radius=0)
    summary, per_seed = bench.run_benchmark([0], lambda seed: frames, selections, epochs=1)
    strategies = {*bench.STRATEGIES, variant}
    assert set(summary) == strategies
    (seed,) = per_seed
    assert {seed[name]["frames_added"] for name in strategies} == {40}
    gains = {name: summary[name].get("worst_slice_gain_over_random") for name in strategies}
    assert gains["random"] is None and gains[variant] == pytest.approx(
        summary[variant]["worst_slice_accuracy"] - summary["random"]["worst_slice_accuracy"]
    )
    with pytest.raises(SystemExit, match="--variant 'nonsense=1'"):
        bench.selections_to_compare(SelectionParams(40), ["nonsense=1"])
    for name in strategies:
        row = summary[name]
        per_slice = row["per_seed"][0]["per_slice"]
        assert row["worst_slice"] == min(per_slice, key=per_slice.get)
        assert 0.0 < row["worst_slice_accuracy"] <= 1.0 and 0.0 < row["overall_accuracy"] <= 1.0


def test_one_engine_space_must_cover_every_candidate_else_the_fallback():
    from aiinfra_pipelines.datasets.selection import embedding_space, frame_embeddings

    keys = pd.DataFrame({"log_id": ["a", "a", "b"], "frame_index": [0, 1, 0]})
    vectors = [np.full(4, i, dtype=np.float32) for i in range(5)]
    table = pd.DataFrame(
        {
            "log_id": ["a", "a", "b", "a", "b"],
            "frame_index": [0, 1, 0, 0, 0],
            "engine_sha": ["new", "new", "new", "old", "old"],
            "embedding": vectors,
        }
    )
    assert embedding_space(table, keys) == "new"
    found, matrix = frame_embeddings(table, keys, "new")
    assert found.all() and matrix[:, 0].tolist() == [0.0, 1.0, 2.0]
    found, matrix = frame_embeddings(table, keys, "old")
    assert found.tolist() == [True, False, True] and matrix[:, 0].tolist() == [3.0, 4.0]
    # Frames embedded only by different engines share no space: selection runs without them.
    assert embedding_space(table[table.index != 1], keys) is None


def test_selection_settings_come_from_datasets_yaml_and_bad_values_name_the_key():
    from aiinfra_pipelines.config import SettingsError, load_resource_yaml
    from aiinfra_pipelines.datasets.settings import SelectionSettings

    settings = SelectionSettings.load()
    assert settings.budget_frames == settings.params.budget_frames > 0
    config = load_resource_yaml("datasets.yaml")
    bad = {**config, "selection": {**config["selection"], "min_slice_share": 1.5}}
    with pytest.raises(SettingsError, match=r"datasets.yaml: selection: .*min_slice_share"):
        SelectionSettings.load(bad)


def test_quotas_beyond_the_budget_reach_every_slice_in_turns():
    # 12 slices x floor 5 = 60 > budget 36, and clip context takes 3 frames per pick: filled
    # in priority order 6 slices would take it all (two picks each); in turns every slice, the
    # rare, confident one with 2 candidates included, gets a pick before any gets a second.
    slices = [f"s{i:02d}" for i in range(11) for _ in range(20)] + ["rare"] * 2
    logs = [f"log-{name}" for name in slices]
    candidates = _candidates(slices, logs)
    candidates["frame_index"] = candidates.groupby("log_id").cumcount()
    candidates["confidence"] = np.where(candidates["slice"] == "rare", 0.99, 0.2)
    params = SelectionParams(budget_frames=36, min_slice_share=0.125, clip_radius=1)
    selection = select_frames(candidates, params, seed=0)
    chosen = selection.chosen["slice"].value_counts()
    assert len(selection.chosen) == 36
    assert set(chosen.index) == set(slices)
    assert chosen["rare"] == 2


def test_coverage_quotas_fill_the_slice_training_lacks_first():
    # Training holds 100 "common", 10 "thin" and no "absent" frames; every slice has 20 equally
    # unsure candidates. Water-filling 20 frames: "absent" takes 10 to reach "thin"'s level,
    # then the two alternate (5 each); "common" gets none.
    slices = ["common"] * 20 + ["thin"] * 20 + ["absent"] * 20
    candidates = _candidates(slices).assign(confidence=0.5)
    trained = pd.Series(["common"] * 100 + ["thin"] * 10)
    params = SelectionParams(budget_frames=20, coverage_share=1.0)
    selection = select_frames(candidates, params, seed=0, train_slices=trained)
    assert selection.summary["quotas"] == {"absent": 15, "thin": 5}
    assert selection.chosen["slice"].value_counts().to_dict() == {"absent": 15, "thin": 5}
    assert selection.summary["trained_per_slice"] == {"common": 100, "thin": 10}
    # Capped by what a slice has: 3 "absent" candidates, the rest flows to the next level.
    few = _candidates(["common"] * 20 + ["thin"] * 20 + ["absent"] * 3).assign(confidence=0.5)
    few = select_frames(few, params, seed=0, train_slices=trained)
    assert few.summary["quotas"] == {"absent": 3, "thin": 17}
    # Without the training slices there is nothing to fill by, and the summary says so.
    blind = select_frames(candidates, params, seed=0)
    assert blind.summary["quotas"] == {}
    assert "no training slices given: no coverage quotas" in blind.summary["notes"]
    with pytest.raises(ValueError, match="coverage_share must be in"):
        SelectionParams(budget_frames=20, coverage_share=1.5)
