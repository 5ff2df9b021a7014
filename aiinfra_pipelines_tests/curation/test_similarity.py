"""Frame similarity: the incremental index, the query, ``aiinfra similar`` and "more like this".

Unit tests publish small embedding tables to a real LocalLake at mining's keys; one module
fixture drives two real upload batches through ingest and mining (model zero), so the index,
the CLI and the launchpad asset run on embeddings the deployed engine actually produced.
"""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.curation.embeddings import (
    FRAME_EMBEDDINGS_PREFIX,
    embedding_matrix,
    published_embeddings,
)
from aiinfra_pipelines.curation.similarity import FrameIndex, UnknownFrameError
from aiinfra_pipelines.curation.similarity_assets import more_like_this, similarity_index
from aiinfra_pipelines.curation.similarity_query import FrameSyntaxError, parse_frame
from aiinfra_pipelines.curation.similarity_requests import (
    latest_more_like_this,
    scenario_candidate_logs,
)
from aiinfra_pipelines.curation.similarity_store import (
    NoSimilarityIndexError,
    load_index,
    update_index,
)
from aiinfra_pipelines.lake.io_manager import parquet_bytes, read_asset_partitions
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.mining.embeddings import embedding_table
from aiinfra_pipelines.perception.deployed import load_deployed_engine
from aiinfra_pipelines.simulation.assets import scenario_library
from aiinfra_pipelines.simulation.from_fleet import fleet_regression_scenarios
from aiinfra_pipelines.simulation.library import LIBRARY_KEY
from aiinfra_pipelines_tests.support.camera import CAMERA_SIZE
from aiinfra_pipelines_tests.support.loop_runs import (
    all_assets_and_checks,
    ingest_and_mine,
    loop_resources,
)
from aiinfra_pipelines_tests.support.simulation_lake import LogSpec, fleet_tables

DIM = 8
ENGINE_A, ENGINE_B = "a" * 64, "b" * 64


# ------------------------------------------------------------------------ small, hand-published
def _table(log_id: str, vectors: np.ndarray, engine: str) -> pd.DataFrame:
    frames = pd.DataFrame({"log_id": log_id, "frame_index": np.arange(len(vectors))})
    return embedding_table(frames, vectors, engine)


def _publish(lake, batch: str, *tables: pd.DataFrame) -> str:
    table = pd.concat(tables, ignore_index=True)
    key = f"{FRAME_EMBEDDINGS_PREFIX}{batch}.parquet"
    return publish_objects(
        lake, "test-" + batch.replace("/", "-"), {key: parquet_bytes(table)}, batch, {}
    )


def _update_and_publish(lake, engine: str):
    update = update_index(lake, engine, DIM)
    publish_objects(lake, "test-index", update.objects(), update.reason, {})
    return update


def _vectors(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((count, DIM), dtype=np.float32)


def test_the_index_adds_only_new_batches_and_names_the_commit_it_indexed(local_lake):
    with pytest.raises(NoSimilarityIndexError, match="no similarity index"):
        load_index(local_lake)
    first_commit = _publish(local_lake, "ingest-a/c1", _table("log-1", _vectors(3, 1), ENGINE_A))
    first = _update_and_publish(local_lake, ENGINE_A)
    assert first.rebuilt and first.reason == "no index yet"
    assert first.added_batches == ("ingest-a/c1",) and first.index.rows == 3
    assert load_index(local_lake).source_commit == first_commit

    second_commit = _publish(local_lake, "ingest-b/c2", _table("log-2", _vectors(2, 2), ENGINE_A))
    second = _update_and_publish(local_lake, ENGINE_A)
    assert not second.rebuilt and second.reason == "1 new batch(es)"
    assert second.added_batches == ("ingest-b/c2",) and second.added_rows == 2
    loaded = load_index(local_lake)
    assert loaded.source_commit == second_commit and loaded.index.rows == 5
    assert loaded.index.keys["log_id"].tolist() == ["log-1"] * 3 + ["log-2"] * 2
    assert loaded.state["batches"]["ingest-a/c1"]["rows"] == 3

    again = update_index(local_lake, ENGINE_A, DIM)
    assert not again.rebuilt and again.added_batches == () and again.reason == "up to date"


def test_a_new_engine_starts_over_with_only_its_own_embeddings(local_lake):
    _publish(local_lake, "ingest-a/c1", _table("log-1", _vectors(3, 1), ENGINE_A))
    _update_and_publish(local_lake, ENGINE_A)
    _publish(
        local_lake,
        "ingest-b/c2",
        _table("log-2", _vectors(2, 2), ENGINE_B),
        _table("log-3", _vectors(4, 3), ENGINE_A),
    )
    update = _update_and_publish(local_lake, ENGINE_B)
    assert update.rebuilt and update.reason.startswith("embedding space changed: engine aaaa")
    assert update.index.rows == 2 and set(update.index.keys["log_id"]) == {"log-2"}
    assert update.state()["other_engine_rows"] == 3 + 4
    with pytest.raises(UnknownFrameError, match="log-1:0 is not in the similarity index"):
        load_index(local_lake).index.search("log-1", 0, 3)


def test_a_re_mined_batch_rebuilds_the_index(local_lake):
    _publish(local_lake, "ingest-a/c1", _table("log-1", _vectors(3, 1), ENGINE_A))
    _update_and_publish(local_lake, ENGINE_A)
    _publish(local_lake, "ingest-a/c1", _table("log-1", _vectors(3, 9), ENGINE_A))
    update = update_index(local_lake, ENGINE_A, DIM)
    assert update.rebuilt and "re-mined or removed (ingest-a/c1)" in update.reason
    assert update.index.rows == 3


def test_a_frame_is_its_own_nearest_neighbour_and_near_duplicates_rank_next():
    vectors = _vectors(40, 5)
    near_duplicate = vectors[7] * 3.0 + 1e-4  # scaled: cosine ignores the norm
    index = FrameIndex(ENGINE_A, DIM)
    index.add_batch("b1", "x", _table("log-1", vectors, ENGINE_A))
    index.add_batch("b2", "y", _table("log-2", near_duplicate[None, :], ENGINE_A))
    hits = index.search("log-1", 7, k=4)
    assert hits[["log_id", "frame_index"]].values.tolist()[:2] == [["log-1", 7], ["log-2", 0]]
    assert hits["distance"].iloc[0] == 0.0 and hits["distance"].iloc[1] < 1e-4
    assert hits["distance"].is_monotonic_increasing and hits["distance"].iloc[2] > 1e-3
    assert hits["rank"].tolist() == [1, 2, 3, 4]
    # Exact cosine: the same order as a brute-force scan.
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    brute = np.argsort(-(unit @ unit[7]), kind="stable")[:3]
    assert hits[hits["log_id"] == "log-1"]["frame_index"].tolist() == brute.tolist()


def test_embedding_matrix_refuses_to_mix_engines():
    mixed = pd.concat(
        [_table("l", _vectors(2, 1), ENGINE_A), _table("m", _vectors(1, 2), ENGINE_B)]
    )
    with pytest.raises(ValueError, match="embeddings of 2 engines"):
        embedding_matrix(mixed)
    matrix = embedding_matrix(_table("l", _vectors(3, 1), ENGINE_A))
    assert matrix.dtype == np.float32 and matrix.shape == (3, DIM)


@pytest.mark.parametrize("bad", ["log-without-index", "log:", ":3", "log:-1", "log:2.5", "log:x"])
def test_bad_frame_references_are_refused(bad):
    with pytest.raises(FrameSyntaxError, match="is not <log_id>:<frame_index>"):
        parse_frame(bad)


def test_the_last_colon_splits_a_frame_reference():
    assert parse_frame(" a:b:12 ") == ("a:b", 12)


def test_scenario_candidates_are_the_nearest_distinct_logs():
    result = pd.DataFrame(
        {
            "rank": [1, 2, 3, 4],
            "frame": ["q:1", "r:4", "q:2", "s:0"],
            "log_id": ["q", "r", "q", "s"],
            "distance": [0.0, 0.1, 0.2, 0.3],
            "query": "q:1",
            "request_id": "run-1",
        }
    )
    picked = scenario_candidate_logs(result, max_logs=2)
    assert picked["log_id"].tolist() == ["q", "r"] and picked["frame"].tolist() == ["q:1", "r:4"]
    assert scenario_candidate_logs(result, max_logs=0).empty


def test_more_like_this_logs_become_scenario_candidates():
    parts = [fleet_tables(LogSpec(log, badcase=False), n, "c1") for n, log in enumerate("pq")]
    index = pd.concat([scene for scene, _ in parts], ignore_index=True)
    no_badcases = pd.concat([badcases for _, badcases in parts], ignore_index=True)
    assert fleet_regression_scenarios(no_badcases, index) == []
    similar = pd.DataFrame(
        {"log_id": ["q"], "frame": ["q:3"], "distance": [0.01], "query": "p:2", "request_id": "r1"}
    )
    (scenario,) = fleet_regression_scenarios(no_badcases, index, similar=similar)
    assert scenario.id == "log-q" and scenario.source["origins"] == ["more_like_this"]
    assert scenario.source["similar_to"] == {
        "query": "p:2",
        "frame": "q:3",
        "distance": 0.01,
        "request_id": "r1",
    }


# ----------------------------------------------------------------- real ingest, mining, index
LOGS_A = ((41, 9),)  # (seed, frames) per log: one log per batch keeps the fixture quick
LOGS_B = ((43, 7),)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two batches ingested and mined with model zero; the index built after each."""
    home = tmp_path_factory.mktemp("similarity")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(home))
        from aiinfra_pipelines.environment import build_lake, load_environment

        lake = build_lake(load_environment())  # the lake the CLI opens
        lake.ensure_repository()
        resources = loop_resources(lake, home)
        with dg.instance_for_test(temp_dir=str(home)) as instance:
            logs_a = [make_synthetic_log(n_frames=n, seed=s, **CAMERA_SIZE) for s, n in LOGS_A]
            (batch_a,) = ingest_and_mine(instance, resources, "sim-a", logs_a)
            first = dg.materialize([similarity_index], instance=instance, resources={"lake": lake})
            logs_b = [make_synthetic_log(n_frames=n, seed=s, **CAMERA_SIZE) for s, n in LOGS_B]
            (batch_b,) = ingest_and_mine(instance, resources, "sim-b", logs_b)
            second = dg.materialize([similarity_index], instance=instance, resources={"lake": lake})
            yield {
                "lake": lake,
                "home": str(home),
                "instance": instance,
                "resources": resources,
                "batches": (batch_a, batch_b),
                "index_runs": (first, second),
                "logs": [log.log_id for log in (*logs_a, *logs_b)],
            }


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        if event.asset_key.path == [asset]:
            return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


def test_mining_publishes_one_embedding_per_frame_from_the_deployed_engine(world):
    lake = world["lake"]
    engine = load_deployed_engine(lake).engine
    embeddings = published_embeddings(lake)
    frames = sum(n for _, n in LOGS_A + LOGS_B)
    assert len(embeddings) == frames and set(embeddings["batch"]) == set(world["batches"])
    assert set(embeddings["engine_sha"]) == {engine.sha256}
    assert embedding_matrix(embeddings).shape == (frames, engine.embedding_dim)
    # The badcases came from the same engine run and are published beside them.
    badcases = read_asset_partitions(lake, "mined_badcases", MAIN_BRANCH)
    assert set(badcases["engine_sha"]) == {engine.sha256}


def test_re_mining_with_the_same_engine_reuses_badcases_and_embeddings(world):
    result = dg.materialize(
        all_assets_and_checks(),
        selection=dg.AssetSelection.assets("mined_badcases", "frame_embeddings"),
        instance=world["instance"],
        resources=world["resources"],
        partition_key=world["batches"][0],
    )
    for asset in ("mined_badcases", "frame_embeddings"):
        assert _metadata(result, asset)["inference"].startswith("skipped"), asset
    reused = result.output_for_node("mine_batch", "frame_embeddings")
    assert len(reused) == sum(n for _, n in LOGS_A)


def test_the_index_grew_by_the_second_batch_only(world):
    first, second = (_metadata(run, "similarity_index") for run in world["index_runs"])
    assert first["update"] == "rebuilt" and first["frames_indexed"] == sum(n for _, n in LOGS_A)
    assert second["update"] == "incremental" and second["added_batches"] == [world["batches"][1]]
    assert second["frames_indexed"] == sum(n for _, n in LOGS_A + LOGS_B)
    assert second["metric"] == "cosine" and second["source_commit"] != first["source_commit"]


runner = CliRunner()


def test_cli_similar_json_names_the_commit_and_the_frame_itself_comes_first(world, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", world["home"])
    log_id = world["logs"][0]
    result = runner.invoke(app, ["similar", f"{log_id}:3", "-k", "5", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 5 and rows[0]["frame"] == f"{log_id}:3" and rows[0]["distance"] == 0.0
    assert {"frame", "distance", "slice", "events", "log_id", "frame_index", "index_commit"} <= set(
        rows[0]
    )
    assert [row["distance"] for row in rows] == sorted(row["distance"] for row in rows)
    assert rows[0]["index_commit"] == load_index(world["lake"]).source_commit
    assert rows[0]["slice"].count("/") == 2 and isinstance(rows[0]["events"], list)

    table = runner.invoke(app, ["similar", f"{log_id}:3", "-k", "3"], terminal_width=200)
    assert table.exit_code == 0 and rows[0]["index_commit"][:12] in table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-colon"], "is not <log_id>:<frame_index>"),
        (["nobody:0"], "nobody:0 is not in the similarity index"),
        (["x:1", "-k", "0"], "-k must be in [1,"),
    ],
)
def test_cli_similar_errors_exit_2(world, monkeypatch, args, message):
    monkeypatch.setenv("DAGSTER_HOME", world["home"])
    result = runner.invoke(app, ["similar", *args])
    assert result.exit_code == 2 and message in result.stderr


def test_cli_similar_without_an_index_exits_2(dagster_home):
    result = runner.invoke(app, ["similar", "log:1"])
    assert result.exit_code == 2 and "no similarity index" in result.stderr


def test_more_like_this_from_the_launchpad_records_its_result(world):
    lake, log_id = world["lake"], world["logs"][1]
    result = dg.materialize(
        [more_like_this],
        instance=world["instance"],
        resources={"lake": lake},
        run_config={"ops": {"more_like_this": {"config": {"frame": f"{log_id}:0", "k": 4}}}},
    )
    metadata = _metadata(result, "more_like_this")
    assert metadata["frame"] == f"{log_id}:0" and metadata["k"] == 4
    assert metadata["index_commit"] == load_index(lake).source_commit
    records = metadata["neighbours"].records
    assert len(records) == 4 and records[0].data["frame"] == f"{log_id}:0"
    stored = latest_more_like_this(lake)
    assert stored["frame"].tolist() == [r.data["frame"] for r in records]
    assert metadata["logs"][0] == log_id and set(metadata["logs"]) <= set(world["logs"])


def test_the_scenario_library_grows_from_the_latest_more_like_this(world):
    lake, log_id = world["lake"], world["logs"][1]
    dg.materialize(
        [more_like_this],
        instance=world["instance"],
        resources={"lake": lake},
        run_config={"ops": {"more_like_this": {"config": {"frame": f"{log_id}:2", "k": 3}}}},
    )
    result = dg.materialize(
        [scenario_library], instance=world["instance"], resources={"lake": lake}
    )
    logs = _metadata(result, "scenario_library")["more_like_this_logs"]
    assert logs[0] == log_id and set(logs) == set(latest_more_like_this(lake)["log_id"])
    library = lake.get_json(MAIN_BRANCH, LIBRARY_KEY)
    grown = {
        entry["source"]["log_id"]
        for entry in library["scenarios"]
        if "more_like_this" in entry.get("source", {}).get("origins", [])
    }
    # At most simulation.yaml max_per_condition per condition: some logs may be capped.
    assert grown and grown <= set(logs)


def test_more_like_this_refuses_an_unknown_frame(world):
    result = dg.materialize(
        [more_like_this],
        instance=world["instance"],
        resources={"lake": world["lake"]},
        run_config={"ops": {"more_like_this": {"config": {"frame": "nobody:0"}}}},
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "nobody:0 is not in the similarity index" in str(failure.event_specific_data.error)
