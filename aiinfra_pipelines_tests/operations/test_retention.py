"""Lineage-aware retention through ``materialize``: plan by default, delete only with approval,
never the lineage of a certified engine.

The lake is built the way the loop writes it: raw uploads committed on ``ingest-<batch>``
branches, ingest's batch and quarantine records (ingest's own record builders) published to
``main``, a training dataset whose manifest names the upload commits (the real
``build_manifest``), a candidate with real ONNX engines trained on it, certified by the real
signer. Ages: the asset judges against the wall clock, so tests that need "old" data set
``max_age_days: 0`` in a copy of the configuration; the plain functions take ``now``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aiinfra_pipelines.config import SettingsError
from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids, freeze_benchmark
from aiinfra_pipelines.datasets.selection import BENCHMARK_MANIFEST
from aiinfra_pipelines.ingest.batch import batch_record_key
from aiinfra_pipelines.ingest.partitions import BatchRef, LogLocation
from aiinfra_pipelines.ingest.quarantine import quarantine_key, quarantine_record
from aiinfra_pipelines.lake.encoding import json_document
from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.operations.retention import DELETE, KEEP, plan_retention
from aiinfra_pipelines.operations.retention_apply import apply_deletions, ensure_ingest_branch
from aiinfra_pipelines.operations.retention_assets import retention
from aiinfra_pipelines.operations.retention_settings import RetentionSettings
from aiinfra_pipelines.operations.telemetry_batch import telemetry_records_key
from aiinfra_pipelines.release.certificate import certify_candidate
from aiinfra_pipelines.simulation.from_fleet import fleet_regression_scenarios
from aiinfra_pipelines.simulation.library import LIBRARY_KEY, merge_library
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.operations_lake import materialized
from aiinfra_pipelines_tests.support.release_lake import (
    publish,
    publish_candidate,
    publish_dataset,
)

OLD = {"operations.yaml": {"retention": {"max_age_days": 0}}}
UNUSED, CERTIFIED, PENDING = "ingest-unused", "ingest-certified", "ingest-pending"
BAD_LOG = "logs/bad-7.mcap"


# ------------------------------------------------------------------------------ lake state
def land(lake: VersionedLake, branch: str, names: list[str]) -> str:
    """One upload commit of raw logs on an ingest branch, as a car's uploader makes it."""
    lake.create_branch(branch, exist_ok=True)
    for name in names:
        lake.put_object(branch, f"logs/{name}.mcap", f"raw {branch} {name}".encode())
    return lake.commit(branch, f"upload {', '.join(names)}")


def ingested(lake: VersionedLake, branch: str, commit: str, quarantined: tuple[str, ...] = ()):
    """What ``published_ingest`` puts on main for a batch: its record and quarantine records."""
    objects = {batch_record_key(BatchRef(branch, commit)): json_document({"accepted": 1})}
    for key in quarantined:
        location = LogLocation(branch, key)
        record = quarantine_record(
            location,
            source_commit=commit,
            checksum=hashlib.sha256(lake.get_object(commit, key)).hexdigest(),
            reasons=[("mcap_unreadable", "not an MCAP file")],
            dagster_run_id="ingest-run",
        )
        objects[quarantine_key(location)] = parquet_bytes(record)
    publish(lake, objects, f"ingest {branch}/{commit[:12]}")


@pytest.fixture
def lake(local_lake, dagster_home) -> VersionedLake:
    """Three ingest branches: unused, feeding a certified engine (plus one rejected log), and
    one whose upload was never ingested."""
    unused = land(local_lake, UNUSED, ["log-x"])
    ingested(local_lake, UNUSED, unused)
    first = land(local_lake, CERTIFIED, ["log-a", "log-b"])
    second = land(local_lake, CERTIFIED, ["log-c", "bad-7"])
    ingested(local_lake, CERTIFIED, first)
    ingested(local_lake, CERTIFIED, second, quarantined=(BAD_LOG,))
    dataset_commit, _ = publish_dataset(local_lake, "dataset-v0001", [first, second])
    publish_candidate(local_lake, "1", seed=1, dataset_commit=dataset_commit)
    certify_candidate(local_lake, "1", Ed25519PrivateKey.generate(), root_run_id="certify-1")
    land(local_lake, PENDING, ["log-p"])
    return local_lake


def run(instance, lake, config: dict | None = None, raise_on_error: bool = True):
    return dg.materialize(
        [retention],
        instance=instance,
        resources={"lake": lake},
        run_config={"ops": {"retention": {"config": config or {}}}},
        raise_on_error=raise_on_error,
    )


def rows_by_name(meta: dict) -> dict[str, dict]:
    return {row.data["name"]: row.data for row in meta["plan"].records}


def branches(lake: VersionedLake) -> set[str]:
    return {branch.name for branch in lake.list_branches(prefix="ingest-")}


# ----------------------------------------------------------------------------------- tests
def test_a_dry_run_plans_old_unused_data_and_deletes_nothing(lake, instance, tmp_path):
    with resources_with(tmp_path / "resources", OLD):
        meta = materialized(run(instance, lake), "retention")

    rows = rows_by_name(meta)
    assert rows[UNUSED]["action"] == DELETE
    assert rows[UNUSED]["dependents"] == ""
    certified = rows[CERTIFIED]
    assert certified["action"] == KEEP
    assert certified["reason"].startswith("lineage of a certified engine")
    assert "certificate model 1 (dataset-v0001)" in certified["dependents"]
    assert "dataset dataset-v0001" in certified["dependents"]
    assert rows[PENDING]["action"] == KEEP
    assert "not ingested yet" in rows[PENDING]["reason"]
    # The rejected log on the kept branch expires on its own; nothing was built from it.
    assert rows[f"{CERTIFIED}/{BAD_LOG}"]["action"] == DELETE
    assert meta["to_delete"] == 2 and meta["dry_run"] is True
    # Nothing deleted, and the plan is on main under its digest.
    assert branches(lake) == {UNUSED, CERTIFIED, PENDING}
    assert lake.object_exists(CERTIFIED, BAD_LOG)
    record = lake.get_json(MAIN_BRANCH, meta["record"])
    assert record["digest"] == meta["plan_digest"]
    assert {row["name"] for row in record["rows"] if row["action"] == DELETE} == {
        UNUSED,
        f"{CERTIFIED}/{BAD_LOG}",
    }


def test_deleting_without_approval_fails_and_deletes_nothing(lake, instance, tmp_path):
    main_head = lake.resolve_ref(MAIN_BRANCH)
    with resources_with(tmp_path / "resources", OLD):
        result = run(instance, lake, {"dry_run": False, "approved_by": "  "}, False)

    assert not result.success
    failure = result.failure_data_for_node("retention")
    assert "approved_by is empty" in failure.user_failure_data.description
    assert branches(lake) == {UNUSED, CERTIFIED, PENDING}
    assert lake.resolve_ref(MAIN_BRANCH) == main_head  # not even a record


def test_an_approved_run_deletes_the_plan_and_records_the_approval(lake, instance, tmp_path):
    main_before = [commit.id for commit in lake.log(MAIN_BRANCH)]
    dataset_source = lake.log(CERTIFIED, limit=1)[0].id
    with resources_with(tmp_path / "resources", OLD):
        digest = materialized(run(instance, lake), "retention")["plan_digest"]
        approved = {"dry_run": False, "approved_by": "ops-lead", "plan_digest": digest[:16]}
        meta = materialized(run(instance, lake, approved), "retention")

    assert branches(lake) == {CERTIFIED, PENDING}
    assert not lake.object_exists(CERTIFIED, BAD_LOG)
    assert lake.object_exists(CERTIFIED, "logs/log-c.mcap")
    # The certified engine's raw lineage is intact: its commits, and the rejected log's bytes
    # at the commit that landed it, are still there.
    assert lake.object_exists(dataset_source, BAD_LOG)
    removal = lake.log(CERTIFIED, limit=1)[0]
    assert removal.metadata["kind"] == "retention"
    assert removal.metadata["approved_by"] == "ops-lead"
    # main only gained records: every earlier commit is still its history, in order.
    main_after = [commit.id for commit in lake.log(MAIN_BRANCH)]
    assert main_after[-len(main_before) :] == main_before
    record = lake.get_json(MAIN_BRANCH, meta["record"])
    assert record["approved_by"] == "ops-lead" and record["plan_digest"] == digest
    assert datetime.fromisoformat(record["approved_at"]) <= datetime.now(UTC)
    assert {row["name"] for row in record["outcome"]["deleted"]} == {
        UNUSED,
        f"{CERTIFIED}/{BAD_LOG}",
    }
    assert record["outcome"]["skipped"] == []
    # Retention's own commit does not make the branch young: it is still judged by its uploads.
    plan = plan_retention(lake, datetime.now(UTC) + timedelta(days=31), RetentionSettings.load())
    assert {row.name: row.action for row in plan.rows}[CERTIFIED] == KEEP


def test_a_certified_engines_lineage_is_kept_whatever_the_config_protects(lake, instance, tmp_path):
    uncertified = land(lake, "ingest-uncertified", ["log-u"])
    ingested(lake, "ingest-uncertified", uncertified)
    publish_dataset(lake, "dataset-v0002", [uncertified])
    protect_nothing = {"operations.yaml": {"retention": {"max_age_days": 0, "protect": []}}}
    with resources_with(tmp_path / "resources", protect_nothing):
        assert RetentionSettings.load().protect == {"certificate"}
        meta = materialized(
            run(instance, lake, {"dry_run": False, "approved_by": "ops-lead"}), "retention"
        )

    rows = rows_by_name(meta)
    assert rows[CERTIFIED]["action"] == KEEP
    assert rows[CERTIFIED]["reason"].startswith("lineage of a certified engine")
    # A dataset no certified engine trained on protects only when the config says so.
    assert rows["ingest-uncertified"]["action"] == DELETE
    assert "unprotected dependents: dataset dataset-v0002" in rows["ingest-uncertified"]["reason"]
    assert "ingest-uncertified" not in branches(lake)
    assert CERTIFIED in branches(lake)


def test_young_branches_are_kept(lake, instance):
    meta = materialized(run(instance, lake, {"dry_run": False, "approved_by": "ops"}), "retention")

    assert meta["to_delete"] == 0
    assert rows_by_name(meta)[UNUSED]["reason"] == "younger than 30 days"
    assert branches(lake) == {UNUSED, CERTIFIED, PENDING}
    # The same branch with the clock moved past the configured age.
    settings = RetentionSettings.load()
    landed = lake.log(UNUSED, limit=1)[0].created_at
    for days, action in ((29.9, KEEP), (30.1, DELETE)):
        plan = plan_retention(lake, landed + timedelta(days=days), settings)
        assert {row.name: row.action for row in plan.rows}[UNUSED] == action


def test_a_stale_plan_is_rechecked_before_anything_is_deleted(lake, instance, tmp_path):
    settings = RetentionSettings.load()
    later = datetime.now(UTC) + timedelta(days=60)
    stale = plan_retention(lake, later, settings)
    assert {row.name for row in stale.deletions} == {UNUSED, f"{CERTIFIED}/{BAD_LOG}"}
    # After the plan was made, a dataset is built from the unused branch's upload.
    publish_dataset(lake, "dataset-v0002", [lake.log(UNUSED, limit=1)[0].id])

    outcome = apply_deletions(
        lake, stale.rows, approved_by="ops", plan_digest=stale.digest, now=later, settings=settings
    )

    assert outcome.skipped == [
        {
            "kind": "ingest_branch",
            "name": UNUSED,
            "reason": "kept on re-check: depended on by dataset dataset-v0002",
        }
    ]
    assert UNUSED in branches(lake)
    # An approver who pinned the old plan's digest is refused rather than surprised.
    with resources_with(tmp_path / "resources", OLD):
        pinned = {"dry_run": False, "approved_by": "ops", "plan_digest": stale.digest}
        result = run(instance, lake, pinned, raise_on_error=False)
    assert not result.success
    description = result.failure_data_for_node("retention").user_failure_data.description
    assert "the plan changed since it was reviewed" in description


def test_retention_settings_refuse_unknown_kinds():
    section = {"max_age_days": 1, "expire": ["main"], "protect": [], "metadata_rows": 5}
    with pytest.raises(SettingsError, match=r"retention\.expire: unknown kinds \['main'\]"):
        RetentionSettings.load({"retention": section})


def test_nothing_outside_ingest_branches_can_be_deleted():
    for name in (MAIN_BRANCH, "run-abc", "telemetry"):
        with pytest.raises(ValueError, match="only ever deletes on ingest-"):
            ensure_ingest_branch(name)


def test_the_cli_shows_the_dry_run_plan(dagster_home, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from aiinfra_pipelines.cli import app
    from aiinfra_pipelines.lake.local import LocalLake

    monkeypatch.delenv("AIINFRA_ENV", raising=False)
    monkeypatch.setenv("COLUMNS", "250")
    lake = LocalLake()  # the lake the CLI opens (local environment, under DAGSTER_HOME)
    lake.ensure_repository()
    ingested(lake, UNUSED, land(lake, UNUSED, ["log-x"]))
    land(lake, PENDING, ["log-p"])
    runner = CliRunner()
    with resources_with(tmp_path / "resources", OLD):
        as_json = runner.invoke(app, ["retention", "--json"], catch_exceptions=False)
        shown = runner.invoke(app, ["retention"], catch_exceptions=False, terminal_width=250)

    assert as_json.exit_code == 0, as_json.output
    plan = json.loads(as_json.output)
    assert {row["name"]: row["action"] for row in plan["rows"]} == {UNUSED: DELETE, PENDING: KEEP}
    assert shown.exit_code == 0, shown.output
    assert "1 to delete, 1 kept" in shown.output
    assert branches(lake) == {UNUSED, PENDING}  # a dry run


def test_uploads_the_loop_has_not_taken_in_are_kept(local_lake):
    telemetry = "ingest-telemetry"
    local_lake.create_branch(telemetry)
    local_lake.put_object(telemetry, "telemetry/uploads/car-1.json", b"[]")
    local_lake.commit(telemetry, "telemetry upload")
    land(local_lake, PENDING, ["log-p"])
    later = datetime.now(UTC) + timedelta(days=365)

    plan = plan_retention(local_lake, later, RetentionSettings.load())
    rows = {row.name: row for row in plan.rows}
    assert rows[telemetry].action == rows[PENDING].action == KEEP
    assert "not ingested yet" in rows[telemetry].reason

    publish(local_lake, {telemetry_records_key(telemetry): b"published"}, "telemetry published")
    plan = plan_retention(local_lake, later, RetentionSettings.load())
    assert {row.name: row.action for row in plan.rows} == {telemetry: DELETE, PENDING: KEEP}


def test_a_scenario_derived_from_a_log_keeps_its_branch(local_lake):
    commit = land(local_lake, UNUSED, ["log-x"])
    ingested(local_lake, UNUSED, commit)
    # A fleet failure on log-x becomes a regression scenario the way the simulation layer
    # derives it from the published scene index.
    index = pd.DataFrame(
        {
            "log_id": ["log-x"],
            "source_commit": [commit],
            "road_type": ["highway"],
            "weather": ["clear"],
            "lighting": ["day"],
            "t_rel_s": [1.0],
            "event_near_collision": [True],
        }
    )
    no_badcases = pd.DataFrame({"log_id": pd.Series([], dtype=str)})
    library, _ = merge_library(
        None, fleet_regression_scenarios(no_badcases, index), built_from={"main_commit": "m"}
    )
    publish(local_lake, {LIBRARY_KEY: json_document(library)}, "scenario library")
    later = datetime.now(UTC) + timedelta(days=365)

    row = plan_retention(local_lake, later, RetentionSettings.load()).rows[0]

    assert (row.name, row.action) == (UNUSED, KEEP)
    assert row.reason == "depended on by scenario log-log-x"


def test_an_unreadable_lineage_keeps_everything(local_lake):
    ingested(local_lake, UNUSED, land(local_lake, UNUSED, ["log-x"]))
    # A dataset tag whose manifest is not at its commit: nothing proves log-x unused.
    local_lake.create_tag("dataset-v0009", local_lake.resolve_ref(MAIN_BRANCH))
    later = datetime.now(UTC) + timedelta(days=365)

    plan = plan_retention(local_lake, later, RetentionSettings.load())

    assert [row.action for row in plan.rows] == [KEEP]
    assert plan.rows[0].reason.startswith("lineage incomplete: dataset-v0009")


def test_the_benchmark_keeps_the_branches_of_its_logs(local_lake):
    landed = {}
    for log in ("log-x", "log-y"):
        branch = f"ingest-{log}"
        landed[log] = (branch, land(local_lake, branch, [log]))
        ingested(local_lake, branch, landed[log][1])
    frames = pd.DataFrame(
        {
            "log_id": list(landed),
            "frame_index": [0, 0],
            "slice": ["day/clear/highway"] * 2,
            "source_commit": [commit for _, commit in landed.values()],
        }
    )
    # As benchmark_set publishes it: the manifest and its member frames.
    manifest = freeze_benchmark(None, frames, fraction=0.5, seed=0, min_logs_per_slice=1)
    (held_out,) = benchmark_log_ids(manifest)
    manifest["frames_key"] = "datasets/benchmark/benchmark-v0001/frames.parquet"
    members = parquet_bytes(frames[frames["log_id"] == held_out])
    objects = {manifest["frames_key"]: members, BENCHMARK_MANIFEST: json_document(manifest)}
    publish(local_lake, objects, "benchmark set")
    later = datetime.now(UTC) + timedelta(days=365)

    plan = plan_retention(local_lake, later, RetentionSettings.load())

    actions = {row.name: (row.action, row.reason) for row in plan.rows}
    (other,) = set(landed) - {held_out}
    assert actions[landed[held_out][0]] == (KEEP, "depended on by benchmark benchmark-v0001")
    assert actions[landed[other][0]][0] == DELETE
