"""Mining cost follows new frames: an unchanged re-run does no inference, a new engine re-mines."""

from __future__ import annotations

import pandas as pd
import pytest

from aiinfra_pipelines.mining.incremental import (
    MiningResultCache,
    frames_to_mine,
    mine_incrementally,
    mined_ledger,
)
from aiinfra_pipelines.perception.engine import OnnxRuntimeEngine

from .conftest import CountingEngine


@pytest.fixture(scope="module")
def base_engine(bootstrap_onnx, spec) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine(bootstrap_onnx, spec, batch_size=32)


def test_frames_to_mine_subtracts_the_ledger_per_engine_sha(fleet):
    assert len(frames_to_mine(fleet, None, "sha-a")) == len(fleet)
    ledger = mined_ledger(fleet, "sha-a")
    assert frames_to_mine(fleet, ledger, "sha-a").empty
    assert len(frames_to_mine(fleet, ledger, "sha-b")) == len(fleet)  # new engine: re-mine all

    first_logs = fleet["log_id"].unique()[:3]
    partial = mined_ledger(fleet[fleet["log_id"].isin(first_logs)], "sha-a")
    todo = frames_to_mine(fleet, pd.concat([partial, mined_ledger(fleet, "sha-b")]), "sha-a")
    assert set(todo["log_id"]) == set(fleet["log_id"]) - set(first_logs)
    assert len(todo) == int((~fleet["log_id"].isin(first_logs)).sum())
    assert list(todo.columns) == list(fleet.columns)


def test_second_run_with_no_new_frames_does_no_inference(fleet, spec, base_engine, config):
    cache = MiningResultCache()
    engine = CountingEngine(base_engine)
    first = mine_incrementally(engine, fleet, None, spec, cache, config)
    assert engine.frames == len(fleet)
    assert first.frames_inferred == len(fleet)
    assert sorted(first.mined_logs) == sorted(fleet["log_id"].unique())
    # Model zero is unsure about everything: every frame is a low-confidence badcase.
    assert len(first.badcases) == len(fleet)
    assert first.badcases["reasons"].str.contains("low_confidence").all()

    calls = engine.calls
    second = mine_incrementally(engine, fleet, None, spec, cache, config)
    assert engine.calls == calls  # not one engine call
    assert second.frames_inferred == 0
    assert second.mined_logs == []
    pd.testing.assert_frame_equal(second.badcases, first.badcases)

    # The cache survives persistence (to_tables → lake → from_tables) with the same effect.
    restored = MiningResultCache.from_tables(*cache.to_tables())
    third = mine_incrementally(engine, fleet, None, spec, restored, config)
    assert engine.calls == calls
    assert len(third.badcases) == len(first.badcases)


def test_new_log_is_the_only_thing_mined(fleet, spec, base_engine, config):
    logs = sorted(fleet["log_id"].unique())
    old, new = fleet[fleet["log_id"].isin(logs[:-1])], fleet[fleet["log_id"] == logs[-1]]
    cache = MiningResultCache()
    engine = CountingEngine(base_engine)
    mine_incrementally(engine, old, None, spec, cache, config)
    before = engine.frames
    result = mine_incrementally(engine, fleet, None, spec, cache, config)
    assert engine.frames - before == len(new)
    assert result.mined_logs == [logs[-1]]
    assert sorted(result.cached_logs) == logs[:-1]
    assert set(result.badcases["log_id"]) <= set(logs)


def test_new_engine_sha_re_mines_everything(fleet, spec, base_engine, config):
    cache = MiningResultCache()
    production = CountingEngine(base_engine)
    mine_incrementally(production, fleet, None, spec, cache, config)
    candidate = CountingEngine(base_engine, sha256="f" * 64)
    result = mine_incrementally(candidate, fleet, None, spec, cache, config)
    assert candidate.frames == len(fleet)
    assert result.frames_inferred == len(fleet)
    assert len(cache) == 2 * fleet["log_id"].nunique()  # one entry per (engine sha, log)


def test_a_log_whose_frames_changed_is_re_mined(fleet, spec, base_engine, config):
    log_id = sorted(fleet["log_id"].unique())[0]
    log = fleet[fleet["log_id"] == log_id]
    cache = MiningResultCache()
    engine = CountingEngine(base_engine)
    mine_incrementally(engine, log.iloc[:-3], None, spec, cache, config)
    before = engine.frames
    mine_incrementally(engine, log, None, spec, cache, config)
    assert engine.frames - before == len(log)
