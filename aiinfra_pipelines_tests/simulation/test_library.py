"""The scenario library: accumulation from badcases and fleet failures, never dropping a
scenario, stable shard assignment, and first-failed / first-fixed records."""

from __future__ import annotations

import copy
from dataclasses import replace

import pandas as pd
import pytest

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.simulation.from_fleet import fleet_regression_scenarios
from aiinfra_pipelines.simulation.gate import evaluate_gate
from aiinfra_pipelines.simulation.library import (
    LibraryError,
    assert_never_dropped,
    merge_library,
    record_results,
    records_by_id,
    scenarios_of_shard,
    shard_keys,
    shard_of,
)
from aiinfra_pipelines.simulation.scenarios import build_scenario
from aiinfra_pipelines.simulation.settings import SIMULATION_CONFIG_FILE
from aiinfra_pipelines_tests.support.simulation_lake import LogSpec, fleet_tables

BUILT = {"main_commit": "c0", "refreshed_for_model_version": ""}


def scenario(scenario_id: str, **fields):
    base = {"road_type": "highway", "weather": "clear", "lighting": "day", "duration_s": 3}
    return build_scenario({**base, **fields}, scenario_id=scenario_id, kind="base", family="f")


def tables(specs: list[LogSpec]) -> tuple[pd.DataFrame, pd.DataFrame]:
    parts = [fleet_tables(spec, seed, "commit-1") for seed, spec in enumerate(specs)]
    return (
        pd.concat([index for index, _ in parts], ignore_index=True),
        pd.concat([badcases for _, badcases in parts], ignore_index=True),
    )


def test_badcase_and_failure_logs_become_reproducible_scenarios():
    index, badcases = tables(
        [
            LogSpec("a", weather="fog", lighting="night"),
            LogSpec("b", road_type="roundabout", badcase=False, near_collision_frame=3),
            LogSpec("c", badcase=False),  # neither a badcase nor a failure: no scenario
            LogSpec("d", road_type="merge", near_collision_frame=8),
        ]
    )
    first = fleet_regression_scenarios(badcases, index)
    by_id = {s.id: s for s in first}
    assert sorted(by_id) == ["log-a", "log-b", "log-d"]
    a, b, d = by_id["log-a"], by_id["log-b"], by_id["log-d"]
    assert (a.kind, a.road_type, a.weather, a.lighting) == ("badcase", "highway", "fog", "night")
    assert a.events == () and a.source["origins"] == ["badcase"]
    assert a.source["source_commit"] == "commit-1" and a.source["log_id"] == "a"
    # A fleet failure on a road without lanes for hazards replays its conditions only ...
    assert (b.kind, b.events) == ("fleet_failure", ())
    assert b.source["failure_flags"] == ["near_collision"]
    # ... on a highway-like road a cut-in at the failure's time (clamped into the episode).
    assert d.kind == "fleet_failure" and d.source["origins"] == ["badcase", "fleet_failure"]
    [hazard] = d.events
    assert hazard["type"] == "cut_in" and 1.0 <= hazard["at_s"] <= d.duration_s - 1.0
    # Reproducible: the same sources give the same scenarios, seeds from the log's content
    # (id and SHA-256), never from the lake commit that landed it (its id differs per run).
    again = fleet_regression_scenarios(badcases, index)
    assert [s.to_dict() for s in again] == [s.to_dict() for s in first]
    assert len({s.seed for s in first}) == 3
    index2 = index.assign(source_commit="commit-2")
    landed_again = {s.id: s.seed for s in fleet_regression_scenarios(badcases, index2)}
    assert landed_again["log-a"] == a.seed
    other_bytes = index.assign(log_sha256="ab" * 32)
    other = {s.id: s for s in fleet_regression_scenarios(badcases, other_bytes)}
    assert other["log-a"].seed != a.seed
    assert other["log-a"].source["log_sha256"] == "ab" * 32


def test_an_empty_lake_gives_no_regression_scenarios():
    assert fleet_regression_scenarios(pd.DataFrame(), pd.DataFrame()) == []


def test_missing_tags_are_a_clear_error():
    index, badcases = tables([LogSpec("a")])
    with pytest.raises(ValueError, match="drive log a: no road_type"):
        fleet_regression_scenarios(badcases.drop(columns=["road_type"]), index.iloc[0:0])


def test_library_accumulates_and_never_drops():
    v1, change = merge_library(None, [scenario("s1"), scenario("s2")], built_from=BUILT)
    assert v1["library_version"] == 1 and change.added == ["s1", "s2"]
    # Same set again: nothing changes, the version stays.
    same, change = merge_library(v1, [scenario("s1"), scenario("s2")], built_from=BUILT)
    assert same["library_version"] == 1 and not change.changed
    # s2's source is gone, s1 is revised, s3 is new: all three remain.
    v2, change = merge_library(
        v1, [scenario("s1", weather="rain"), scenario("s3")], built_from=BUILT
    )
    ids = [entry["id"] for entry in v2["scenarios"]]
    assert ids == ["s1", "s2", "s3"]
    assert (change.added, change.revised, change.orphaned) == (["s3"], ["s1"], ["s2"])
    entries = {entry["id"]: entry for entry in v2["scenarios"]}
    assert entries["s2"]["orphaned"] is True
    assert entries["s1"]["weather"] == "rain"
    assert entries["s1"]["revisions"] == [
        {"version": v1["scenarios"][0]["version"], "replaced_in": 2}
    ]
    assert entries["s1"]["added_in"] == 1 and entries["s3"]["added_in"] == 2
    assert [h["library_version"] for h in v2["history"]] == [1, 2]
    # Every version contains every earlier scenario.
    for earlier in (v1, v2):
        assert {e["id"] for e in earlier["scenarios"]} <= {e["id"] for e in v2["scenarios"]}


def test_a_write_that_loses_a_scenario_is_refused():
    v1, _ = merge_library(None, [scenario("s1"), scenario("s2")], built_from=BUILT)
    shrunk = {**v1, "scenarios": v1["scenarios"][:1]}
    with pytest.raises(LibraryError, match=r"drops 1 scenario\(s\): \['s2'\]"):
        assert_never_dropped(v1, shrunk)
    with pytest.raises(LibraryError, match="version would go back"):
        assert_never_dropped(v1, {**v1, "library_version": 0})


def test_shard_assignment_is_stable_as_the_library_grows():
    ids = [f"scenario-{i}" for i in range(200)]
    assert shard_keys(2) == ["shard-00", "shard-01"] and len(shard_keys(120)[-1]) == 9
    first = {i: shard_of(i, 4) for i in ids}
    assert first == {i: shard_of(i, 4) for i in reversed(ids)}  # independent of order
    assert set(first.values()) == {0, 1, 2, 3}  # all shards used
    grown, _ = merge_library(None, [scenario(i) for i in ids[:50]], built_from=BUILT)
    more, _ = merge_library(grown, [scenario(i) for i in ids], built_from=BUILT)
    for key in shard_keys(4):
        before = {s.id for s in scenarios_of_shard(grown, key, 4)}
        after = {s.id for s in scenarios_of_shard(more, key, 4)}
        assert before <= after
    union = [s.id for key in shard_keys(4) for s in scenarios_of_shard(more, key, 4)]
    assert sorted(union) == sorted(ids)
    with pytest.raises(LibraryError, match="unknown shard 'shard-09'"):
        scenarios_of_shard(more, "shard-09", 4)


def metrics(collision=False, progress=120.0, seed=0):
    return {
        "collision": collision,
        "collision_step": 3 if collision else None,
        "min_ttc_s": None,
        "hard_brakes": 0,
        "progress_m": progress,
        "duration_s": 4.0,
        "seed": seed,
    }


def runs(*collided):
    """One engine's episodes on a scenario, a seed each (``True``: it crashed)."""
    return [metrics(collision=c, seed=i) for i, c in enumerate(collided)]


def outcome(scenario_id, candidate, production, **more):
    return {
        "scenario_id": scenario_id,
        "slice": "day/clear/highway",
        "kind": "base",
        "road_type": "highway",
        "candidate": candidate,
        "production": production,
        **more,
    }


def record(library, gate, version, *, production="p0", engine="e"):
    return record_results(
        library,
        gate.comparisons,
        candidate_version=version,
        production_version=production,
        candidate_accepted=gate.passed,
        candidate_engine_sha256=f"{engine}{version}",
        fix_alpha=GATES["tests"]["fix_confirmation"]["alpha"],
    )


def test_a_fix_is_recorded_only_when_confirmed_and_then_binds_paired_to_the_fixer():
    library, _ = merge_library(
        None, [scenario("s1"), scenario("s2"), scenario("s3")], built_from=BUILT, seed_count=6
    )
    # Every entry records the seeds its engines drive (a pure function of its content).
    assert [len(e["seeds"]) for e in library["scenarios"]] == [6, 6, 6]
    # v1 vs production p0: p0 crashes on s1's 12 seeds, v1 on none (p = 1/4096: confirmed);
    # on s2 p0 crashes on five seeds of 12, v1 on two others (p = 29/128: not confirmed).
    clean, crashes = runs(*[False] * 12), runs(*[True] * 12)
    rows = [
        outcome("s1", clean, crashes),
        outcome(
            "s2",
            runs(*[False] * 5, True, True, *[False] * 5),
            runs(*[True] * 5, *[False] * 7),
        ),
        outcome("s3", clean, clean),
    ]
    gate = evaluate_gate(rows, records_by_id(library), gates=GATES, production_version="p0")
    assert gate.passed, gate.failures
    library, changes = record(library, gate, "1")
    records = records_by_id(library)
    assert records["s1"]["first_failed_by"] == "p0" and records["s1"]["first_fixed_by"] == "1"
    assert records["s1"]["fixed_engine_sha256"] == "e1"
    assert records["s1"]["fixed_confirmation"]["p_value"] == pytest.approx(1 / 4096)
    assert records["s2"]["first_fixed_by"] is None  # better, but not beyond chance
    assert records["s3"]["first_failed_by"] is None
    assert changes == [
        {"scenario_id": "s1", "first_failed_by": "p0", "first_fixed_by": "1"},
        {"scenario_id": "s2", "first_failed_by": "p0", "first_fixed_by": None},
    ]
    # v2, still against p0, crashes on s1 again: held to v1's outcomes on the same seeds.
    again = [
        outcome("s1", crashes, crashes, fixer=clean, fixer_version="1"),
        rows[1],
        rows[2],
    ]
    refused = evaluate_gate(again, records, gates=GATES, production_version="p0")
    assert any(
        f.startswith("scenario s1: regressed fix of model version 1") for f in refused.failures
    )
    library, _ = record(library, refused, "2")
    assert records_by_id(library)["s1"]["first_fixed_by"] == "1"  # "first": never overwritten
    assert records_by_id(library)["s1"]["last_result"]["status"] == "regressed_fix"


def test_a_refused_candidate_fixes_nothing():
    library, _ = merge_library(None, [scenario("s1"), scenario("s2")], built_from=BUILT)
    rows = [
        outcome("s1", runs(*[False] * 12), runs(*[True] * 12)),  # would be a fix ...
        outcome("s2", runs(*[True] * 12), runs(*[False] * 12)),  # ... but this regressed
    ]
    gate = evaluate_gate(rows, records_by_id(library), gates=GATES)
    assert not gate.passed
    library, _ = record(library, gate, "3")
    records = records_by_id(library)
    assert records["s1"] == {**records["s1"], "first_failed_by": "p0", "first_fixed_by": None}
    assert records["s2"]["first_failed_by"] == "3"
    with pytest.raises(LibraryError, match="which the library lacks"):
        unknown = [replace(gate.comparisons[0], scenario_id="nope")]
        record_results(
            library,
            unknown,
            candidate_version="3",
            production_version="p0",
            candidate_accepted=False,
            candidate_engine_sha256="e3",
            fix_alpha=0.05,
        )


GATES = load_resource_yaml("gates.yaml")["simulation"]


def test_model_zero_badcases_make_no_scenario_but_its_fleet_failures_do():
    """Before the first release every frame is a badcase of the untrained engine: those logs
    make no scenario; a near collision still does, and a released engine's badcases do."""
    index, badcases = tables(
        [
            LogSpec("a"),
            LogSpec("b", near_collision_frame=3),
            LogSpec("c", weather="rain"),
        ]
    )
    badcases = badcases.assign(
        engine_version=badcases["log_id"].map({"a": "bootstrap-0", "b": "bootstrap-0", "c": "3"})
    )
    ids = [s.id for s in fleet_regression_scenarios(badcases, index)]
    assert ids == ["log-b", "log-c"]
    every_engine = copy.deepcopy(load_resource_yaml(SIMULATION_CONFIG_FILE))
    every_engine["regression_scenarios"]["exclude_badcases_mined_by"] = []
    assert [s.id for s in fleet_regression_scenarios(badcases, index, every_engine)] == [
        "log-a",
        "log-b",
        "log-c",
    ]


def test_logs_sharing_a_definition_make_at_most_the_configured_number_of_scenarios():
    """Five fog-night badcase logs are one scenario under five seeds: two are kept, those
    with the most badcase frames; a library scenario keeps its place; other conditions and
    kinds are not limited by them."""
    specs = [LogSpec(f"fog-{i}", weather="fog", lighting="night") for i in range(5)]
    specs += [LogSpec("clear", weather="clear"), LogSpec("fail", near_collision_frame=3)]
    index, badcases = tables(specs)
    # fog-3 and fog-1 have the most badcase frames
    extra = badcases[badcases["log_id"].isin(["fog-3", "fog-1"])]
    badcases = pd.concat([badcases, extra.assign(frame_index=extra["frame_index"] + 100)])
    badcases = pd.concat([badcases, badcases[badcases["log_id"] == "fog-3"].assign(frame_index=7)])
    config = copy.deepcopy(load_resource_yaml(SIMULATION_CONFIG_FILE))
    config["regression_scenarios"]["max_per_condition"] = 2
    ids = [s.id for s in fleet_regression_scenarios(badcases, index, config)]
    assert ids == ["log-clear", "log-fail", "log-fog-1", "log-fog-3"]
    # A library that already holds fog-0 keeps it; one slot is left for the best new log.
    kept = fleet_regression_scenarios(badcases, index, config, in_library=frozenset({"log-fog-0"}))
    assert [s.id for s in kept] == ["log-clear", "log-fail", "log-fog-0", "log-fog-3"]
    # Without the cap every log is a scenario.
    del config["regression_scenarios"]["max_per_condition"]
    assert len(fleet_regression_scenarios(badcases, index, config)) == 7
