"""The main job end to end, as shipped: ``aiinfra demo``, two cycles, production gates, with
its daemon killed mid-loop — the loop's mechanics and its learning outcome in one run.

Cycle 1: the demo's fleet (``resources/demo.yaml``: 14 cars x 8 drives, >= 5,000 frames) lands
one upload batch of logs and telemetry; the real ``dagster-daemon`` ingests, mines, retrains,
exports, quantizes, simulates, certifies, shadows, starts the canary and signs OTA metadata.
While the training run is in flight the test kills the daemon (SIGKILL, a crash); the demo
restarts it as a deployment would, and no work may be lost, no run launched twice.
Cycle 2: the cars in the canary cohort drive with the new engine (their logs say so), the
rollout decides on their fresh telemetry, and a second candidate trains on cycle 1's mined
badcases plus the new logs. The simulation gate refuses it (below), so v1 keeps the fleet and
the closing drive's telemetry judges v1's rollout. ``summary.json`` records both cycles.

The learning outcome, by the production gates (the demo's overlays size rollout cohorts and
sensor intervals only — checked below; the test lifts only the wall-clock budgets, see
``UNTIMED_BUDGETS``): cycle 1's candidate reaches the accuracy targets and is certified;
cycle 2's candidate is better on the slice cycle 1 was weakest on, yet worse than v1 in one
fleet-failure scenario, and refused for it; every rollout decision agrees with the telemetry
it cites. Release verdicts and rollout decisions are deterministic (gates-2: simulation seeds
derive from scenario and log content, never from lake commit ids; telemetry is judged one
publish at a time), so both are pinned. Slow (36 minutes of a fresh-clone CI run on 2 cores,
where gates-2 simulates up to 150 seeds of a scenario in doubt) but run in CI: it replaced a
smaller run on an eight-drive fleet whose gates had to be lifted, since a candidate trained on
eight drives cannot pass them. The first release is judged non-inferior to the oracle, paired
on the same seeds (gates.yaml simulation.first_release), not against an absolute cap.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from aiinfra_pipelines.config import PROJECT_ROOT, resources_dir
from aiinfra_pipelines.fleet.conditions import plan_conditions
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.io_manager import read_asset_partitions, read_parquet_prefix
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX, root_run_id_of_branch
from aiinfra_pipelines.release.rollout_telemetry import latest_telemetry_commit
from aiinfra_pipelines_tests.support.config_copies import resources_with

pytestmark = pytest.mark.slow

RUN_KEY_TAG = "dagster/run_key"
# What a rollout's history records for each action its stage evaluation can take.
DECISION_EVENTS = {
    "advance": {"stage_started"},
    "await_approval": {"awaiting_approval"},
    "hold": {"healthy"},
    "complete": {"completed"},
    "rollback": {"rolled_back"},
    "wait": {"waiting"},
}
DEMO = yaml.safe_load((resources_dir() / "demo.yaml").read_text())
VEHICLES, EPISODES = int(DEMO["fleet"]["vehicles"]), int(DEMO["fleet"]["episodes"])
SEED = int(DEMO["fleet"]["seed"])
TIMEOUT_S = int(DEMO["timeout_s"])
DEMO_CLOSING_EPISODES = int(DEMO["closing_drive"]["episodes"])
# The targets for the first candidate on the frozen benchmark.
MIN_ACCURACY, MIN_F1, MIN_SLICE_ACCURACY = 0.93, 0.88, 0.85
MIN_FRAMES_PER_CYCLE = 5000
# The fleet-failure scenario (mined from seed 7's cycle-1 logs) on which v2 is worse than v1.
REFUSING_SCENARIO = "log-20240615T100010-c661792993"
# v1's rollout, decision by decision: (event, action, candidate frames, collisions, control
# frames, collisions). Telemetry publishes are judged one at a time, oldest first, the fleet
# drives deterministically and the wall-clock latency budget is lifted below, so the
# decisions are a function of the seed. Under gates-3 a 14-car canary keeps collecting: its
# sequential test neither shows harm nor non-inferiority on a few thousand frames, and each
# decision states the exposure still needed (demo run on the rollout-evidence branch,
# 2026-12-07).
PINNED_ROLLOUT = [
    ("shadow", None, None, None, None, None),
    ("stage_started", None, None, None, None, None),  # canary, at cycle 1's end
    ("waiting", "wait", 1102, 2, 6524, 15),  # cycle 2: 2 vs 9 at fault, ~18,614 more frames
    ("waiting", "wait", 1522, 2, 9007, 20),  # the closing round: 2 vs 10 at fault, ~19,294 more
]
# Budgets on wall-clock time measure the runner, not the engine: on a shared 2-core CI machine
# the certification's latency gate (p99 at batch 1 on the host) and the rollout's telemetry
# latency budget (what the cars' sessions measured beside the daemon) flip with the load.
# The demo runs on a copy of resources/ with only these lifted, so every verdict below rests
# on deterministic figures; engine speed is benchmarks/engines.py's business.
UNTIMED_BUDGETS = {
    "gates.yaml": {
        "deployment": {
            "latency": {"cpu-ci": {"p99_ms_batch1": 1.0e6, "min_throughput_fps": 1.0e-6}}
        },
        "release": {"rollout": {"budgets": {"latency_p95_ms": 1.0e6}}},
    }
}


def _assert_decided_on_its_evidence(entry: dict) -> None:
    """A rollout decision agrees with the telemetry it cites.

    A rollback names breaches, each beyond its budget; a step forward (advance, awaiting
    approval, hold, complete) names none and rests on both cohorts' frames. Which way each
    step went is pinned separately (PINNED_ROLLOUT): this says the decision is consistent.
    """
    decision = entry["decision"]
    action, breaches = decision["action"], decision["breaches"]
    assert entry["event"] in DECISION_EVENTS[action], entry
    if action == "rollback":
        assert breaches, entry
        for breach in breaches:
            if breach["metric"] == "confidence_mean_drop":
                assert breach["control"] - breach["candidate"] > breach["budget"], breach
            else:
                assert breach["candidate"] - breach["control"] > breach["budget"], breach
    elif action != "wait":
        assert breaches == [], entry
        assert decision["candidate"]["frames"] > 0 and decision["control"]["frames"] > 0, entry


def _rollout_step(entry: dict) -> tuple:
    """(event, action, candidate frames, collisions, control frames, collisions) of a decision."""
    decision = entry.get("decision") or {}
    candidate, control = decision.get("candidate") or {}, decision.get("control") or {}
    return (
        entry["event"],
        decision.get("action"),
        candidate.get("frames"),
        candidate.get("collisions"),
        control.get("frames"),
        control.get("collisions"),
    )


def _first_cycle_repeats_a_slice() -> bool:
    plan = plan_conditions(["city"] * VEHICLES, EPISODES, SEED)
    slices = [(c.lighting, c.weather, c.road_type) for row in plan for c in row]
    return len(set(slices)) < len(slices)


def _overlays_relax_no_gate() -> None:
    """The demo's overlays touch only rollout cohort sizes and sensor intervals: offline,
    simulation, deployment and release gates, the recipe and the triggers are production's."""
    gates = DEMO["overlays"].get("gates.yaml") or {}
    assert set(gates) <= {"release"}, gates
    assert set(gates.get("release") or {}) <= {"rollout"}, gates
    assert set(gates["release"]["rollout"]) <= {"stages"}, gates
    assert {"training.yaml", "triggers.yaml", "mining.yaml"}.isdisjoint(DEMO["overlays"])


def _kill_the_daemon_while_training(home: Path, demo: subprocess.Popen) -> int:
    """Wait for the training run to start, then SIGKILL the daemon; returns the killed pid.

    The instance is opened only once the demo has started its daemon, i.e. after the demo
    created the instance's sqlite storages: two processes creating them at once both stamp
    the schema's version, and every later open fails on "more than one head".
    """
    pid_file = home / "demo" / "daemon.pid"
    deadline = time.monotonic() + TIMEOUT_S
    instance = None
    while time.monotonic() < deadline:
        assert demo.poll() is None, "the demo ended before its training run started"
        if not pid_file.is_file():
            time.sleep(1.0)
            continue
        instance = instance or dg.DagsterInstance.from_config(str(home))
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="training_cycle"), limit=1)
        if runs and runs[0].status == dg.DagsterRunStatus.STARTED:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(1.0)
    raise TimeoutError("no training run started")


def _sensor_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """Runs a sensor launched, without the daemon's automatic re-executions of dead runs."""
    return [r for r in instance.get_runs() if RUN_KEY_TAG in r.tags and r.parent_run_id is None]


def test_the_demo_learns_by_the_production_gates_and_survives_a_daemon_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _overlays_relax_no_gate()
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # the instance's dagster.yaml refers to it
    shutil.copy(PROJECT_ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    with resources_with(tmp_path / "resources", UNTIMED_BUDGETS) as untimed:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "AIINFRA_RESOURCES": str(untimed),
            "SDL_VIDEODRIVER": "dummy",
            "COLUMNS": "200",
        }
    aiinfra = Path(sys.executable).with_name("aiinfra")
    assert _first_cycle_repeats_a_slice()  # else nothing could be held out to benchmark
    with (tmp_path / "demo.out").open("w") as out:
        demo = subprocess.Popen(
            [str(aiinfra), "demo"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT
        )
        try:
            killed = _kill_the_daemon_while_training(home, demo)
            returncode = demo.wait(timeout=TIMEOUT_S)
        finally:
            if demo.poll() is None:
                demo.kill()
    stdout = (tmp_path / "demo.out").read_text()
    assert returncode == 0, stdout[-4000:]
    assert f"dagster-daemon exited (-{int(signal.SIGKILL)}); restarting it (1)" in stdout, killed

    instance = dg.DagsterInstance.from_config(str(home))
    lake = LocalLake(root=str(home / "lake"))
    # -- nothing lost, nothing launched twice ---------------------------------------------------
    first_training = instance.get_runs(filters=dg.RunsFilter(job_name="training_cycle"))[-1]
    assert first_training.status == dg.DagsterRunStatus.SUCCESS  # it outlived its daemon
    keys = collections.Counter(run.tags[RUN_KEY_TAG] for run in _sensor_runs(instance))
    assert [key for key, count in keys.items() if count > 1] == []
    ingest_runs = [r for r in _sensor_runs(instance) if "lakefs_ingest_sensor" in r.job_name]
    partitions = collections.Counter(r.tags["dagster/partition"] for r in ingest_runs)
    assert len(partitions) == 2 and max(partitions.values()) == 1  # one run per upload batch
    summary = json.loads((home / "demo" / "summary.json").read_text())
    first, second = summary["cycles"]
    index = scene_index_view(lake)
    quarantined = quarantine_view(lake)
    assert list(quarantined["reason_codes"]) == ["truncated"]  # the demo's corrupt upload
    landed_logs = first["logs_landed"] + second["logs_landed"]
    # Every upload is indexed (raw logs, and index records of segments the cars kept) or
    # quarantined; the demo's cache never evicts, so no pull notice travels.
    every_row = read_asset_partitions(lake, "scene_index", MAIN_BRANCH)
    assert every_row["log_key"].nunique() + len(quarantined) == landed_logs
    uploads = first["uploads"]
    assert uploads["raw_logs"] > 0 and uploads["evictions"] == 0, uploads
    held = every_row[~every_row["raw_available"]]
    assert held["log_key"].str.endswith(".index.json").all()  # index records, never frames
    assert set(held["frames_object"]) <= {""}
    storage = second["storage"]
    assert storage["frames_stored"] == len(index)
    assert 0 < storage["frames_ever_trained_on"] <= storage["frames_stored"], storage
    # Mining asked for the index-only segments of cycle 1's weakest slices (when it had any);
    # the cars that held them sent them, and ingest answered every request.
    asked = (second.get("pulls") or {}).get("requested", 0)
    assert second["uploads"]["pulls_served"] == asked, (second.get("pulls"), second["uploads"])
    answered = second["pull_requests"]
    assert answered.get("served", 0) + answered.get("closed", 0) == asked, answered
    assert answered.get("open", 0) == 0, answered
    for cycle in (first, second):  # pulled logs count as landed in the cycle that sent them
        assert cycle["kpis"]["frames_published_share"] <= 1.0, cycle["kpis"]
    assert len(index) == first["frames_accepted"] + second["frames_accepted"]
    assert first["logs_quarantined"] == 1 and second["logs_quarantined"] == 0
    failed = {r.run_id for r in instance.get_runs() if r.status == dg.DagsterRunStatus.FAILURE}
    for branch in lake.list_branches(prefix=RUN_BRANCH_PREFIX):
        assert root_run_id_of_branch(branch.name) in failed  # kept only for inspection

    # -- cycle 1 took the candidate all the way to the canary ---------------------------------
    assert lake.object_exists(MAIN_BRANCH, "candidates/1/certificate.json")
    assert lake.object_exists(MAIN_BRANCH, "ota/metadata/timestamp.json")
    state = lake.get_json(MAIN_BRANCH, "release/rollout/1.json")
    events = [entry["event"] for entry in state["history"]]
    assert events[:2] == ["shadow", "stage_started"]
    for heading in ("training cycle SUCCESS", "certification model version 1: certified", "OTA"):
        assert heading in stdout, stdout[-4000:]
    assert first["model_version"] == "1" and first["certified"] is True
    assert first["rollout"]["stage"] == "canary"  # where cycle 1 left it
    for key in ("accuracy", "f1", "lead_gap_mae_m", "worst_slice", "baseline_accuracy"):
        assert first["benchmark"][key] is not None, first["benchmark"]
    sim = first["simulation"]
    assert sim["scenarios"] > 0
    assert {"candidate_at_fault", "production_at_fault", "oracle_at_fault"} <= set(sim)
    # Every verdict names the rules it was judged under, and both cycles ran under one.
    assert sim["gates_sha256"] == summary["gates_sha256"] == second["simulation"]["gates_sha256"]
    assert first["kpis"]["landing_to_certified_s"] > 0
    assert first["kpis"]["compute_s_by_stage"]["training"] > 0
    assert summary["total_s"] >= first["cycle_s"] + second["cycle_s"]

    # -- cycle 2: the cohort drove perception-v1, the rollout judged its telemetry ------------
    fleet_line = rf"fleet {VEHICLES} cars × {EPISODES} drives: (.*)"
    cycle2 = re.search(fleet_line, stdout.split("cycle 2 of 2")[1])
    assert cycle2 and "runs perception-v1" in cycle2.group(1), stdout[-4000:]
    telemetry = read_parquet_prefix(lake, MAIN_BRANCH, PUBLISHED_TELEMETRY_PREFIX)
    (batch,) = [b for b in telemetry["batch_id"].unique() if b.endswith(f"-c2-s{SEED}")]
    latest = telemetry[telemetry["batch_id"] == batch]
    cohort = latest[latest["cohort"] == "candidate"]
    assert set(cohort["software_version"]) <= {"perception-v1"}
    assert set(cohort["engine_sha256"]) <= {state["engine_sha256"]}
    control = latest[latest["cohort"] != "candidate"]
    assert set(control["software_version"]) <= {"rule-planner-0"}
    # ... which ran the candidate in shadow mode, every frame compared.
    assert (control["shadow_engine_sha256"] == state["engine_sha256"]).all()
    assert (control["shadow_frames"] == control["frames"]).all()
    branches = sorted(index["source_branch"].unique())
    logged = set(index.loc[index["source_branch"] == branches[-1], "software_version"])
    assert logged <= {"perception-v1", "rule-planner-0"}
    # ... and the rollout judged that batch, on evidence that supports its decision.
    assert len(events) >= 3, state["history"]  # shadow, canary started, then cycle 2's verdict
    verdict = state["history"][2]
    _assert_decided_on_its_evidence(verdict)

    # -- the closing drive: the newest rollout judged on telemetry driven after it began ------
    closing = second["closing_drive"]
    rounds = closing["rounds"]
    assert closing["telemetry_records"] == closing["drives"]
    assert 1 <= rounds <= int(DEMO["closing_drive"]["max_rounds"])
    assert closing["drives"] == VEHICLES * DEMO_CLOSING_EPISODES * rounds
    current = lake.get_json(MAIN_BRANCH, "release/rollout/current.json")["model_version"]
    assert closing["model_version"] == current
    # v2 is refused by the simulation gate, on one scenario, every run (deterministic: seeds
    # from scenario and log content; two runs of the demo on 2026-12-07 gave the same counts):
    # it failed 33 of that scenario's 150 paired seeds where v1 passed, v1 9 where v2 passed.
    # The offline, parity and latency gates passed; v1 keeps the fleet, no rollout of v2 exists.
    second_sim = second["simulation"]
    assert second["certified"] is False and second_sim["passed"] is False, second_sim
    (failure,) = second_sim["failures"]
    assert failure.startswith(f"scenario {REFUSING_SCENARIO}: worse than production"), failure
    assert second_sim["confirmed_scenarios"] > 0, second_sim  # it asked for more seeds first
    assert "certification model version 2: not certified" in stdout, stdout[-4000:]
    assert current == "1", current
    assert not lake.object_exists(MAIN_BRANCH, "release/rollout/2.json")
    # Its last entry is the decision on the closing drive's telemetry (the newest on main),
    # and the rounds stop as soon as the rollout decides.
    history = lake.get_json(MAIN_BRANCH, f"release/rollout/{current}.json")["history"]
    judged = history[-1]
    _assert_decided_on_its_evidence(judged)
    assert judged["decision"]["telemetry_commit"] == latest_telemetry_commit(lake), judged
    if rounds < int(DEMO["closing_drive"]["max_rounds"]):
        assert judged["event"] != "waiting", judged
    # ... and every decision of the rollout is the seed's, not the daemon's timing's.
    assert [_rollout_step(entry) for entry in history] == PINNED_ROLLOUT, history
    # A stage that keeps collecting says how much more exposure its tests need, and the
    # summary an operator reads shows the same figures as the rollout's record.
    assert judged["decision"]["exposure_needed_frames"] > 0, judged
    view = closing["rollout"]
    assert view["decision"] == judged["decision"]["action"], view
    for key in ("exposure_frames", "exposure_needed_frames"):
        assert view[key] == judged["decision"][key], (key, view)
    # Still collecting after the last round: the rounds stop at their cap, not on a decision
    # (with three rounds on 2026-12-07 rounds two and three still waited, ~37,500 and ~52,300
    # more frames needed).
    assert rounds == int(DEMO["closing_drive"]["max_rounds"]), closing

    # -- the loop learns, by the production gates ---------------------------------------------
    assert first["frames_landed"] >= MIN_FRAMES_PER_CYCLE
    assert second["frames_landed"] >= MIN_FRAMES_PER_CYCLE
    bench = first["benchmark"]
    assert bench["accuracy"] >= MIN_ACCURACY and bench["f1"] >= MIN_F1, bench
    assert bench["worst_slice_accuracy"] >= MIN_SLICE_ACCURACY, bench
    assert bench["accuracy"] > bench["baseline_accuracy"]
    assert bench["lead_gap_mae_m"] < bench["baseline_lead_gap_mae_m"]
    # certified above with the first-release floors and limits of gates.yaml, not relaxed ones
    assert sim["candidate_at_fault"] <= sim["model_zero_at_fault"], sim
    # Cycle 2 trained on cycle 1's mined badcases plus the new logs, and improved the slice
    # cycle 1 was weakest on.
    assert second["model_version"] == "2"
    weakest = bench["worst_slice"]
    assert second["benchmark"]["slices"][weakest] > bench["worst_slice_accuracy"], (
        weakest,
        second["benchmark"],
    )
    assert second["benchmark"]["accuracy"] >= bench["accuracy"] - 0.01, second["benchmark"]
