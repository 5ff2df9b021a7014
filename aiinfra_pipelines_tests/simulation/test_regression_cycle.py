"""The simulation assets materialized with Dagster on a small published lake state.

One module-scoped lake carries a whole cycle: library → shards → report for a PerceptionNet
candidate, then a reckless candidate that must be refused, shards of two candidates that no
report may mix, an A/A candidate, then a library rebuild that must not drop anything. MLflow
runs on a temporary sqlite store.

Each stage is a module fixture that depends on the stage before it and records the commit of
``main`` it left; tests read the lake at that commit. So the stages run in their order whatever
order the tests run in (``pytest -p randomly``), and no test sees a later stage's writes.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PRODUCTION_POINTER_KEY
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import publish_objects
from aiinfra_pipelines.perception.contract import perception_spec
from aiinfra_pipelines.perception.deployed import bootstrap_onnx
from aiinfra_pipelines.sensors.simulation_sensor import regression_simulation_sensor
from aiinfra_pipelines.simulation.candidate import report_key
from aiinfra_pipelines.simulation.library import LIBRARY_KEY
from aiinfra_pipelines.simulation.results import RESULTS_PREFIX, shard_result_key
from aiinfra_pipelines.training.resources import mlflow_tracking_uri
from aiinfra_pipelines_tests.support.simulation_engines import perception_net_onnx, reckless_onnx
from aiinfra_pipelines_tests.support.simulation_lake import (
    LogSpec,
    launch,
    materialize,
    new_mlflow_run,
    publish_candidate,
    publish_fleet_tables,
    simulation_resources,
)

pytestmark = pytest.mark.timeout(300)
SHARDS = ["shard-00", "shard-01"]
LOGS = [
    LogSpec("log-a-badcase", road_type="highway", weather="rain", lighting="day"),
    LogSpec("log-b-failure", road_type="merge", badcase=False, near_collision_frame=6),
]


@pytest.fixture(scope="module")
def cycle(test_resources, tmp_path_factory):
    root = tmp_path_factory.mktemp("sim-assets")
    lake = LocalLake(root=str(root / "lake"))
    lake.ensure_repository()
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    resources = simulation_resources(lake, tracking_uri)
    publish_fleet_tables(lake, LOGS, "fleet-tables")
    (root / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(root / "dagster")) as instance:
        yield {
            "lake": lake,
            "resources": resources,
            "instance": instance,
            "tracking_uri": tracking_uri,
            "artifacts": root / "mlruns",
        }


def run_cycle(cycle, model_version: str, onnx: bytes, *, raise_on_error: bool = True):
    """Library → every shard → report for one candidate, materialized directly."""
    lake, resources, instance = cycle["lake"], cycle["resources"], cycle["instance"]
    run_id = new_mlflow_run(cycle["tracking_uri"], cycle["artifacts"])
    publish_candidate(lake, model_version, onnx, run_id)
    assert materialize(instance, resources, "scenario_library").success
    for shard in SHARDS:
        result = materialize(
            instance,
            resources,
            "regression_simulation",
            partition_key=shard,
            model_version=model_version,
        )
        assert result.success
    report = materialize(
        instance,
        resources,
        "regression_report",
        model_version=model_version,
        raise_on_error=raise_on_error,
    )
    return run_id, report


def tick(cycle) -> tuple[list[dg.RunRequest], str]:
    context = dg.build_sensor_context(instance=cycle["instance"], resources={"lake": cycle["lake"]})
    result = regression_simulation_sensor(context)
    if isinstance(result, dg.SkipReason):
        return [], result.skip_message or ""
    return list(result.run_requests or []), ""


def main_commit(cycle) -> str:
    """The commit ``main`` is at now: what a stage leaves for its tests to read."""
    return cycle["lake"].resolve_ref(MAIN_BRANCH)


@pytest.fixture(scope="module")
def library_stage(cycle):
    """The library built from the scenario files and the fleet tables, before any candidate."""
    result = materialize(cycle["instance"], cycle["resources"], "scenario_library")
    return {"success": result.success, "commit": main_commit(cycle)}


@pytest.fixture(scope="module")
def sensor_cycle(cycle, library_stage):
    """Candidate 1 driven through the whole cycle by the sensor. Every tick is evaluated twice
    before its runs launch (what a daemon does when runs are slow to start)."""
    lake = cycle["lake"]
    run_id = new_mlflow_run(cycle["tracking_uri"], cycle["artifacts"])
    publish_candidate(lake, "1", perception_net_onnx(seed=3), run_id)
    ticks, results = [], {}
    for _ in range(4):
        requests, reason = tick(cycle)
        repeated, _ = tick(cycle)
        ticks.append(
            {
                "keys": sorted(r.run_key for r in requests),
                "repeated_keys": sorted(r.run_key for r in repeated),
                "reason": reason,
            }
        )
        if not requests:
            break
        for request in requests:
            results[request.run_key] = launch(cycle, request)
        after, _ = tick(cycle)
        launched = set(results)
        ticks[-1]["after_launch"] = sorted(r.run_key for r in after if r.run_key in launched)
    return {"run_id": run_id, "ticks": ticks, "results": results, "commit": main_commit(cycle)}


def test_library_holds_base_badcase_and_failure_scenarios(cycle, library_stage):
    lake = cycle["lake"]
    assert library_stage["success"]
    library = lake.get_json(library_stage["commit"], LIBRARY_KEY)
    by_id = {entry["id"]: entry for entry in library["scenarios"]}
    assert {"cruise", "slow_lead", "degraded"} <= set(by_id)
    badcase = by_id["log-log-a-badcase"]
    assert badcase["kind"] == "badcase"
    assert (badcase["road_type"], badcase["weather"], badcase["lighting"]) == (
        "highway",
        "rain",
        "day",
    )
    assert badcase["source"]["log_id"] == "log-a-badcase"
    assert badcase["source"]["source_commit"]
    assert "low_confidence" in badcase["source"]["badcase_reasons"]
    failure = by_id["log-log-b-failure"]
    assert failure["kind"] == "fleet_failure"
    assert failure["source"]["failure_flags"] == ["near_collision"]
    assert [event["type"] for event in failure["events"]] == ["cut_in"]
    assert all(entry["first_failed_by"] is None for entry in library["scenarios"])


def test_sensor_walks_a_candidate_through_library_shards_and_report(cycle, sensor_cycle):
    ticks = sensor_cycle["ticks"]
    assert [t["keys"] for t in ticks] == [
        ["library-1"],
        ["sim-1-shard-00", "sim-1-shard-01"],
        ["report-1"],
        [],
    ]
    assert all(result.success for result in sensor_cycle["results"].values())
    assert "already has regression results" in ticks[-1]["reason"]
    shard_run = sensor_cycle["results"]["sim-1-shard-00"]
    assert shard_run.dagster_run.tags["aiinfra/model_version"] == "1"
    # The shard reads the library at the commit the sensor saw it refreshed at.
    pinned = shard_run.dagster_run.run_config["ops"]["regression_simulation"]["config"]
    lake = cycle["lake"]
    assert pinned["library_commit"] and lake.object_exists(pinned["library_commit"], LIBRARY_KEY)
    library = lake.get_json(pinned["library_commit"], LIBRARY_KEY)
    assert library["built_from"]["refreshed_for_model_version"] == "1"


def test_sensor_duplicate_ticks_launch_nothing_new(sensor_cycle):
    """A repeated tick asks for the same run keys (Dagster launches a key once), and once a
    key has a run the sensor never requests it again."""
    for evaluated in sensor_cycle["ticks"]:
        assert evaluated["repeated_keys"] == evaluated["keys"]
        assert evaluated.get("after_launch", []) == []


def test_cycle_publishes_report_records_and_mlflow_artifact(cycle, sensor_cycle):
    import mlflow

    lake = cycle["lake"]
    run_id = sensor_cycle["run_id"]
    result = sensor_cycle["results"]["report-1"]
    report = lake.get_json(sensor_cycle["commit"], report_key("1"))
    assert report["model_version"] == "1"
    # The untrained candidate falls back on every frame (below), driving as cautiously as model
    # zero: it causes no collision, so it is within the first release's margin of the oracle.
    assert report["passed"] is True and report["failures"] == [], report["aggregate"]
    assert report["summary"]["candidate_at_fault"] == 0, report["summary"]
    library = lake.get_json(sensor_cycle["commit"], LIBRARY_KEY)
    assert library["built_from"]["refreshed_for_model_version"] == "1"
    assert {row["scenario_id"] for row in report["scenarios"]} == {
        entry["id"] for entry in library["scenarios"]
    }
    seeds = report["seeds_per_scenario"]
    assert seeds == 2  # the test resources' first stage of seeds
    assert report["seed_stages"] == [2, 5]
    # Seeds are the scenario's own, as the library records them: a pure function of content.
    recorded = {entry["id"]: entry["seeds"] for entry in library["scenarios"]}
    for row in report["scenarios"]:
        assert [e["seed"] for e in row["candidate"]["episodes"]] == recorded[row["scenario_id"]][:2]
    for row in report["scenarios"]:
        # Every planner, every seed: the two compared, the oracle (ceiling) and model zero (floor).
        for engine in ("candidate", "production", "oracle", "model_zero"):
            summary = row[engine]
            assert 0.0 <= summary["pass_rate"] <= 1.0
            assert summary["at_fault_collisions"] <= summary["collisions"] <= seeds
            assert len(summary["episodes"]) == seeds
            assert len({e["seed"] for e in summary["episodes"]}) == seeds
            for metrics in summary["episodes"]:
                for name in (
                    "collision",
                    "at_fault_collision",
                    "collision_type",
                    "min_ttc_s",
                    "progress_m",
                    "hard_brakes",
                    "max_abs_jerk_mps3",
                    "fallback_activations",
                ):
                    assert name in metrics
        # Ground truth never falls back for lack of confidence.
        assert row["oracle"]["fallback_activations"] == 0
    # Both engines are untrained networks: near-zero confidence, fallback from the first step.
    assert all(row["candidate"]["fallback_activations"] >= 1 for row in report["scenarios"])
    # Production is model zero before the first release: the same episodes, simulated once.
    for row in report["scenarios"]:
        assert row["production"]["episodes"] == row["model_zero"]["episodes"]
    assert report["reference_version"] == report["production"]["model_version"] == "bootstrap-0"
    shards = [lake.get_json(sensor_cycle["commit"], shard_result_key(shard)) for shard in SHARDS]
    episodes = sum(len(s["scenarios"]) for s in shards) * seeds
    assert sum(s["simulated_runs"] + s["reused_runs"] for s in shards) == 3 * episodes
    # The headline figures, in the report and in the asset's metadata.
    summary = report["summary"]
    assert summary["scenarios"] == len(report["scenarios"])
    assert summary["episodes"] == len(report["scenarios"]) * seeds
    for role in ("candidate", "production", "oracle", "model_zero"):
        at_fault = sum(row[role]["at_fault_collisions"] for row in report["scenarios"])
        assert summary[f"{role}_at_fault"] == at_fault
    assert summary["production_at_fault"] == summary["model_zero_at_fault"]
    # Records: production's failures are recorded against production's version.
    failed = {e["id"]: e["first_failed_by"] for e in library["scenarios"]}
    for row in report["scenarios"]:
        if not row["production"]["passed"]:
            assert failed[row["scenario_id"]] == "bootstrap-0"
    # Shards are the current partition values on main, for this candidate.
    for shard in SHARDS:
        assert (
            lake.get_json(sensor_cycle["commit"], shard_result_key(shard))["model_version"] == "1"
        )
    # The check re-ran the gate on the published report and agrees with it.
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.passed == report["passed"]
    assert evaluation.metadata["report_verdict_matches"].value is True
    metadata = result.asset_materializations_for_node("regression_report")[0].metadata
    assert "Regression simulation" in metadata["report"].value
    assert metadata["scenario_table"].value.records
    # The verdict says which rule decided it (a first release: the oracle, not the table).
    explained = metadata["verdict_explained"].value
    assert explained.startswith("PASSED: a first release is judged against the oracle"), explained
    for key in (
        "candidate_at_fault",
        "production_at_fault",
        "oracle_at_fault",
        "model_zero_at_fault",
        "scenarios",
        "seeds_per_scenario",
    ):
        assert metadata[key].value == summary[key], key
    with mlflow_tracking_uri(cycle["tracking_uri"]):
        listed = mlflow.MlflowClient().list_artifacts(run_id, "regression_simulation")
        stored = json.loads(
            mlflow.artifacts.load_text(f"runs:/{run_id}/regression_simulation/report.json")
        )
    assert {item.path for item in listed} == {
        "regression_simulation/report.md",
        "regression_simulation/report.json",
    }
    assert stored["model_version"] == "1" and stored["passed"] == report["passed"]
    # Nothing released yet: production is model zero, so the candidate is judged against the
    # oracle, paired, instead of against production; no scenario test binds it.
    assert report["aggregate"]["first_release"] is True
    assert report["tests"] == [] and report["aggregate"]["first_release_upper_bound"] < 0.5
    assert report["gates_sha256"] == gate_rules().sha256
    assert report["calibration"]["simulation"] is not None


@pytest.fixture(scope="module")
def replayed_report(cycle, sensor_cycle, tmp_path_factory):
    """Candidate 1's report made again on another lake from the same fleet tables and engine:
    another machine, another day, other lake commit ids — and no cached outcome."""
    root = tmp_path_factory.mktemp("sim-replay")
    lake = LocalLake(root=str(root / "lake"))
    lake.ensure_repository()
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    resources = simulation_resources(lake, tracking_uri)
    publish_fleet_tables(lake, LOGS, "fleet-tables-replay")
    run_id = new_mlflow_run(tracking_uri, root / "mlruns")
    publish_candidate(lake, "1", perception_net_onnx(seed=3), run_id)
    (root / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(root / "dagster")) as instance:
        assert materialize(instance, resources, "scenario_library").success
        for shard in SHARDS:
            assert materialize(
                instance,
                resources,
                "regression_simulation",
                partition_key=shard,
                model_version="1",
            ).success
        assert materialize(instance, resources, "regression_report", model_version="1").success
    return lake.get_object(MAIN_BRANCH, report_key("1"))


def test_the_same_engines_on_the_same_library_give_the_same_report(
    cycle, sensor_cycle, replayed_report
):
    """Seeds are a pure function of content and nothing in a report depends on when or how
    fast it ran: the report is the same bytes, whatever commit ids the lakes gave."""
    original = cycle["lake"].get_object(sensor_cycle["commit"], report_key("1"))
    assert json.loads(original)["scenarios"], "an empty report proves nothing"
    assert replayed_report == original


def _release_cautious_production(lake) -> None:
    """A released production engine (the cautious untrained network, as model version 1)."""
    key = "release/engines/cautious.onnx"
    publish_objects(
        lake,
        "test-release",
        {
            key: bootstrap_onnx(perception_spec()),
            PRODUCTION_POINTER_KEY: json.dumps({"version": "1", "onnx_key": key}).encode(),
        },
        "release model version 1 (test stand-in for the release layer)",
        {"kind": "release"},
    )


@pytest.fixture(scope="module")
def reckless_stage(cycle, sensor_cycle):
    """A cautious production released, then a never-braking candidate 2 through the cycle."""
    _release_cautious_production(cycle["lake"])
    _, result = run_cycle(cycle, "2", reckless_onnx())
    return {"result": result, "commit": main_commit(cycle)}


def test_reckless_candidate_is_refused_for_new_failures(cycle, reckless_stage):
    lake, result, commit = cycle["lake"], reckless_stage["result"], reckless_stage["commit"]
    report = lake.get_json(commit, report_key("2"))
    assert report["passed"] is False
    new_failures = [row for row in report["scenarios"] if row["status"] == "new_failure"]
    assert new_failures, "a never-braking engine must fail where the cautious production passes"
    # Every refusal names its rule and where: a scenario, a slice or the library.
    assert report["failures"]
    for failure in report["failures"]:
        assert failure.split(":")[0].split(" ")[0] in {"scenario", "slice", "library"}, failure
    regressed = {t["scenario_id"] for t in report["tests"] if t["regressed"]}
    assert regressed, report["failures"]  # the reckless engine is worse beyond chance somewhere
    for scenario_id in regressed:
        assert any(
            f.startswith(f"scenario {scenario_id}: worse than production")
            for f in report["failures"]
        )
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.passed is False
    assert set(evaluation.metadata["regressed_scenarios"].value) == regressed
    # The refused candidate's failures are recorded; it fixes nothing.
    library = {e["id"]: e for e in lake.get_json(commit, LIBRARY_KEY)["scenarios"]}
    for row in new_failures:
        assert library[row["scenario_id"]]["first_failed_by"] == "2"
    assert all(entry["first_fixed_by"] != "2" for entry in library.values())
    # Scenarios in doubt ran the second stage, driven by the candidate and production only.
    shards = [lake.get_json(commit, shard_result_key(shard)) for shard in SHARDS]
    assert shards[0]["seed_stages"] == [2, 5]
    for row in report["scenarios"]:
        test = next(t for t in row["tests"] if t["reference"] == "production")
        extended = row["seeds"] == 5
        assert row["seeds"] in (2, 5)
        assert len(row["production"]["episodes"]) == row["seeds"]
        assert len(row["oracle"]["episodes"]) == len(row["model_zero"]["episodes"]) == 2
        assert test["pairs"] == row["seeds"]
        if not extended:
            assert test["worse"] <= test["better"] or test["worse"] == 0
    assert regressed <= {row["scenario_id"] for row in report["scenarios"] if row["seeds"] == 5}
    # On the first stage production (model zero's bytes), oracle and model zero outcomes were
    # reused from the cache, not simulated again: only the new candidate drove them. The second
    # stage is new for the candidate and production.
    for shard in shards:
        extended_here = [row for row in shard["scenarios"] if len(row["candidate"]) == 5]
        assert shard["simulated_runs"] == len(shard["scenarios"]) * 2 + len(extended_here) * 3 * 2
        for role in ("oracle", "model_zero"):
            assert all(row["cached"][role] for row in shard["scenarios"])
    assert lake.list_objects(commit, RESULTS_PREFIX)


@pytest.fixture(scope="module")
def mixed_shards_stage(cycle, reckless_stage):
    """Shard 00 re-simulated for candidate 1 while shard 01 holds candidate 2's, then a report."""
    resources, instance = cycle["resources"], cycle["instance"]
    shard = materialize(
        instance, resources, "regression_simulation", partition_key="shard-00", model_version="1"
    )
    failed = materialize(instance, resources, "regression_report", raise_on_error=False)
    return {"shard": shard, "failed": failed, "commit": main_commit(cycle)}


def test_report_refuses_shards_of_different_candidates(cycle, reckless_stage, mixed_shards_stage):
    lake, failed = cycle["lake"], mixed_shards_stage["failed"]
    before = lake.get_json(reckless_stage["commit"], report_key("2"))
    assert mixed_shards_stage["shard"].success
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.step_failure_data.error
    message = error.cause.message if error.cause else error.message
    assert "different candidates" in message and "model_version" in message
    assert "shard-00: model_version=1" in message and "shard-01: model_version=2" in message
    after = lake.get_json(mixed_shards_stage["commit"], report_key("2"))
    assert after == before  # main untouched


@pytest.fixture(scope="module")
def aa_stage(cycle, mixed_shards_stage):
    """A/A through the assets: production released, a candidate with the same engine bytes.

    Runs on the library the earlier cycles simulated (``sensor_cycle`` warmed the oracle and
    model-zero outcomes of every scenario) and before the library rebuild adds a scenario no
    planner has driven yet, so the only episodes left to simulate are the shared engine's.
    """
    lake = cycle["lake"]
    engine = perception_net_onnx(seed=11)
    key = "release/engines/v4.onnx"
    publish_objects(
        lake,
        "test-release-4",
        {
            key: engine,
            PRODUCTION_POINTER_KEY: json.dumps({"version": "4", "onnx_key": key}).encode(),
        },
        "release model version 4 (test stand-in for the release layer)",
        {"kind": "release"},
    )
    _, result = run_cycle(cycle, "5", engine)
    return {"result": result, "commit": main_commit(cycle)}


def test_a_candidate_identical_to_production_is_certified_by_the_regression_report(cycle, aa_stage):
    lake, result, commit = cycle["lake"], aa_stage["result"], aa_stage["commit"]
    report = lake.get_json(commit, report_key("5"))
    assert report["passed"] is True, report["failures"]
    assert report["aggregate"]["first_release"] is False  # gated against production
    summary = report["summary"]
    assert summary["candidate_at_fault"] == summary["production_at_fault"]
    for row in report["scenarios"]:
        assert row["candidate"]["episodes"] == row["production"]["episodes"]
    # One engine in two roles is simulated once: oracle and model zero come from the cache.
    for shard in SHARDS:
        record = lake.get_json(commit, shard_result_key(shard))
        assert record["candidate_engine_sha256"] == record["production_engine_sha256"]
        for row in record["scenarios"]:
            assert row["cached"]["oracle"] and row["cached"]["model_zero"], row["scenario_id"]
            assert len(row["seeds"]) == 2  # identical outcomes leave nothing in doubt
        assert record["simulated_runs"] <= sum(len(r["seeds"]) for r in record["scenarios"])
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.passed is True


def test_library_rebuild_never_drops_scenarios(cycle, aa_stage, test_resources):
    lake, resources, instance = cycle["lake"], cycle["resources"], cycle["instance"]
    before = lake.get_json(aa_stage["commit"], LIBRARY_KEY)
    moved = test_resources / "cruise.yaml.removed"
    (test_resources / "scenarios" / "cruise.yaml").rename(moved)
    try:
        publish_fleet_tables(lake, [LogSpec("log-c-new", lighting="night")], "fleet-tables-2")
        assert materialize(instance, resources, "scenario_library").success
    finally:
        moved.rename(test_resources / "scenarios" / "cruise.yaml")
    after = lake.get_json(MAIN_BRANCH, LIBRARY_KEY)
    before_ids = {e["id"] for e in before["scenarios"]}
    after_by_id = {e["id"]: e for e in after["scenarios"]}
    assert before_ids < set(after_by_id)
    assert "log-log-c-new" in after_by_id
    assert after_by_id["cruise"]["orphaned"] is True  # its file is gone; the scenario stays
    assert after["library_version"] == before["library_version"] + 1
    kept = {e["id"]: e["first_failed_by"] for e in before["scenarios"]}
    assert all(after_by_id[i]["first_failed_by"] == kept[i] for i in kept)
