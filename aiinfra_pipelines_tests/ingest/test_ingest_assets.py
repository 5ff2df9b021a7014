"""An ingest batch end to end through ``dg.materialize``: publish, quarantine, audits."""

from __future__ import annotations

import dataclasses
import json
import shutil

import dagster as dg

from aiinfra_pipelines.config import resources_dir
from aiinfra_pipelines.ingest.views import quarantine_view, scene_index_view
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX
from aiinfra_pipelines.logs.anonymize import find_pii_leaks
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log
from aiinfra_pipelines_tests.support.ingest_runs import (
    land,
    materialize_partition,
    partition_of,
    verdicts_of,
)

from . import reexecution_job


def _with_nan_speed(log):
    log.frames[3] = dataclasses.replace(log.frames[3], speed_mps=float("nan"))
    return log


def _with_time_going_back(log):
    log.frames[5] = dataclasses.replace(log.frames[5], timestamp_ns=log.frames[2].timestamp_ns)
    return log


def _with_drifted_metadata(log):
    log.metadata["vehicle_identifier"] = log.metadata.pop("vin")
    return log


def test_good_log_is_published_to_main_without_pii(local_lake, instance, ingest_resources):
    log = make_synthetic_log(n_frames=24, seed=1)
    batch = land(local_lake, "b1", [("good", log)])
    main_before = local_lake.resolve_ref(MAIN_BRANCH)

    result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success
    assert verdicts_of(result) == {batch.keys[0]: "accepted"}
    assert all(check.passed for check in result.get_asset_check_evaluations())
    assert len(result.get_asset_check_evaluations()) >= 5  # PII check + every GX suite
    index = scene_index_view(local_lake)
    assert len(index) == 24
    assert set(index["slice"]) == {"day/clear/highway"}
    assert index["event_hard_brake"].sum() == 1
    assert index["vehicle_pseudonym"].str.fullmatch(r"veh-[0-9a-f]{16}").all()
    # Raw logs (with their VINs) never reach main; derived data does, with its lineage.
    assert local_lake.list_objects(MAIN_BRANCH, prefix="logs/") == []
    merge = local_lake.log(MAIN_BRANCH, limit=1)[0]
    assert merge.id != main_before
    assert merge.metadata["source_commit"] == batch.commit
    assert merge.metadata["source_branch"] == batch.branch
    main_bytes = b"".join(
        local_lake.get_object(MAIN_BRANCH, stat.key)
        for stat in local_lake.list_objects(MAIN_BRANCH)
    )
    assert log.metadata["vin"].encode() not in main_bytes
    raw_coordinates = {(frame.latitude, frame.longitude) for frame in log.frames}
    assert find_pii_leaks(index, {log.metadata["vin"]}, raw_coordinates) == []
    assert all(log.metadata["vin"] not in str(c.metadata) for c in local_lake.log(MAIN_BRANCH))
    # The run branch was merged and removed: nothing unpublished is left behind.
    assert local_lake.list_branches(prefix=RUN_BRANCH_PREFIX) == []


BAD_LOGS = {
    "truncated": (lambda: encode_drive_log(make_synthetic_log(seed=2))[:-700], "truncated"),
    "missing_channel": (
        lambda: encode_drive_log(make_synthetic_log(seed=3), omit_topics={"/vehicle/can"}),
        "missing_channel",
    ),
    "nan_speed": (
        lambda: encode_drive_log(_with_nan_speed(make_synthetic_log(seed=4))),
        "non_finite_signal",
    ),
    "time_back": (
        lambda: encode_drive_log(_with_time_going_back(make_synthetic_log(seed=5))),
        "non_monotonic_time",
    ),
    "drift": (
        lambda: encode_drive_log(_with_drifted_metadata(make_synthetic_log(seed=6))),
        "schema_drift",
    ),
    # Recorded but never through the car's anonymizer: readable plates.
    "unblurred": (
        lambda: encode_drive_log(make_synthetic_log(seed=8, vehicle_anonymized=False)),
        "residual_pii",
    ),
}


def test_bad_logs_are_quarantined_and_the_good_ones_publish_in_one_merge(
    local_lake, instance, ingest_resources
):
    payloads = {name: make_payload() for name, (make_payload, _) in BAD_LOGS.items()}
    good = [("good-a", make_synthetic_log(seed=9)), ("good-b", make_synthetic_log(seed=10))]
    batch = land(local_lake, "b-mixed", [*payloads.items(), *good])
    main_before = local_lake.resolve_ref(MAIN_BRANCH)

    result = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert result.success  # bad logs never fail their batch
    verdicts = verdicts_of(result)
    assert verdicts == {
        **{f"logs/{name}.mcap": "quarantined" for name in BAD_LOGS},
        "logs/good-a.mcap": "accepted",
        "logs/good-b.mcap": "accepted",
    }
    # Every reason, per log, in the quarantine table on main.
    quarantine = quarantine_view(local_lake).set_index("log_key")
    assert sorted(quarantine.index) == sorted(f"logs/{name}.mcap" for name in BAD_LOGS)
    for name, (_, expected_code) in BAD_LOGS.items():
        assert expected_code in quarantine.loc[f"logs/{name}.mcap", "reason_codes"].split(",")
    # Never deleted: the raw objects are still on their ingest branch, byte for byte.
    for name, payload in payloads.items():
        assert local_lake.get_object(batch.branch, f"logs/{name}.mcap") == payload
    # Never merged; the good logs of the same batch are, in exactly one merge.
    index = scene_index_view(local_lake)
    assert set(index["log_key"]) == {"logs/good-a.mcap", "logs/good-b.mcap"}
    merges = local_lake.log(MAIN_BRANCH, stop_at=main_before)
    assert [c.metadata.get("kind") for c in merges if len(c.parents) == 2] == ["ingest"]
    (published,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key.path == ["published_ingest"]
    ]
    assert published.materialization.metadata["logs_quarantined"].value == len(BAD_LOGS)
    assert published.materialization.metadata["logs_accepted"].value == 2
    assert not local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
    # The PII reason names the frames and regions, so the car's team can find the slip.
    reasons = json.loads(quarantine.loc["logs/unblurred.mcap", "reasons"])
    (pii,) = [reason for reason in reasons if reason["code"] == "residual_pii"]
    assert "60 region(s) in 20 frame(s)" in pii["message"]
    assert "frame 0 front plate at (" in pii["message"]


def test_rerunning_a_published_batch_changes_nothing_on_main(
    local_lake, instance, ingest_resources
):
    batch = land(
        local_lake,
        "b-rerun",
        [
            ("good", make_synthetic_log(seed=15)),
            ("bad", encode_drive_log(make_synthetic_log(seed=16))[:-600]),
        ],
    )
    first = materialize_partition(instance, ingest_resources, partition_of(batch))
    assert verdicts_of(first) == {"logs/bad.mcap": "quarantined", "logs/good.mcap": "accepted"}
    main_after_first = local_lake.resolve_ref(MAIN_BRANCH)

    again = materialize_partition(instance, ingest_resources, partition_of(batch))

    assert again.success
    assert set(verdicts_of(again).values()) == {"already_ingested"}
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_after_first
    assert len(scene_index_view(local_lake)) == 20
    assert len(quarantine_view(local_lake)) == 1
    assert not local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)


def test_identical_content_is_ingested_once_and_recorded_as_a_duplicate(
    local_lake, instance, ingest_resources
):
    payload = encode_drive_log(make_synthetic_log(seed=17))
    first = land(local_lake, "b-dup1", [("original", payload), ("same-again", payload)])
    result = materialize_partition(instance, ingest_resources, partition_of(first))
    assert verdicts_of(result) == {
        "logs/original.mcap": "accepted",
        "logs/same-again.mcap": "duplicate",
    }

    # The same bytes uploaded again in another batch, under another name: still one copy.
    second = land(local_lake, "b-dup2", [("resent", payload)])
    resent = materialize_partition(instance, ingest_resources, partition_of(second))

    assert resent.success
    table = resent.output_for_node("ingest_batch", "validated_drive_logs").set_index("log_key")
    assert table.loc["logs/resent.mcap", "verdict"] == "duplicate"
    assert table.loc["logs/resent.mcap", "duplicate_of"] == f"{first.branch}/logs/original.mcap"
    index = scene_index_view(local_lake)
    assert set(index["log_key"]) == {"logs/original.mcap"} and len(index) == 20


def test_a_grown_branch_ingests_only_its_new_logs(local_lake, instance, ingest_resources):
    first = land(local_lake, "b-grow", [("early", make_synthetic_log(seed=18))])
    materialize_partition(instance, ingest_resources, partition_of(first))

    later = land(local_lake, "b-grow", [("late", make_synthetic_log(seed=19))])
    result = materialize_partition(instance, ingest_resources, partition_of(later))

    assert verdicts_of(result) == {"logs/late.mcap": "accepted"}
    index = scene_index_view(local_lake)
    assert index.groupby("log_key").size().to_dict() == {
        "logs/early.mcap": 20,
        "logs/late.mcap": 20,
    }


def test_failed_audit_leaves_main_unchanged(
    local_lake, instance, ingest_resources, tmp_path, monkeypatch
):
    strict = tmp_path / "resources"
    shutil.copytree(resources_dir(), strict)
    suite = strict / "expectations" / "scene_index_ranges.json"
    suite.write_text(suite.read_text().replace('"max_value": 70', '"max_value": 1'))
    monkeypatch.setenv("AIINFRA_RESOURCES", str(strict))
    batch = land(local_lake, "b-audit", [("fast", make_synthetic_log(seed=11))])
    main_before = local_lake.resolve_ref(MAIN_BRANCH)

    result = materialize_partition(
        instance, ingest_resources, partition_of(batch), raise_on_error=False
    )

    failed = [c for c in result.get_asset_check_evaluations() if not c.passed]
    assert [c.check_name for c in failed] == ["gx_scene_index_ranges"]
    published = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key.path == ["published_ingest"]
    ]
    assert published == []
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_before
    assert scene_index_view(local_lake).empty
    # The audited outputs wait on the run branch for an operator, they are not lost.
    (run_branch,) = local_lake.list_branches(prefix=RUN_BRANCH_PREFIX)
    assert local_lake.list_objects(run_branch.name, prefix="data/scene_index/")


def _strict_resources(tmp_path, monkeypatch, relative: str, old: str, new: str) -> None:
    """Run with a copy of resources/ in which one setting is changed."""
    changed = tmp_path / "resources"
    shutil.copytree(resources_dir(), changed)
    target = changed / relative
    assert old in target.read_text()
    target.write_text(target.read_text().replace(old, new))
    monkeypatch.setenv("AIINFRA_RESOURCES", str(changed))


def test_pii_leak_blocks_the_publish(local_lake, instance, ingest_resources, tmp_path, monkeypatch):
    # An anonymizer misconfigured to keep full GPS precision: the blocking check must catch it.
    _strict_resources(tmp_path, monkeypatch, "logs.yaml", "gps_decimals: 3", "gps_decimals: 9")
    batch = land(local_lake, "b-leak", [("log", make_synthetic_log(seed=12))])
    main_before = local_lake.resolve_ref(MAIN_BRANCH)

    result = materialize_partition(
        instance, ingest_resources, partition_of(batch), raise_on_error=False
    )

    (pii,) = [
        c
        for c in result.get_asset_check_evaluations()
        if c.check_name == "anonymized_frames_have_no_pii"
    ]
    assert not pii.passed and pii.metadata["leaks"].value >= 1
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_before
    assert not any(
        e.asset_key.path == ["published_ingest"] for e in result.get_asset_materialization_events()
    )


def test_reexecuting_only_the_publish_step_cannot_skip_a_failed_audit(
    local_lake, instance, tmp_path, monkeypatch
):
    _strict_resources(
        tmp_path,
        monkeypatch,
        "expectations/scene_index_ranges.json",
        '"max_value": 70',
        '"max_value": 1',
    )
    monkeypatch.setenv(reexecution_job.LAKE_ROOT_ENV, local_lake.root)
    batch = land(local_lake, "b-bypass", [("fast", make_synthetic_log(seed=13))])
    partition = partition_of(batch)
    instance.add_dynamic_partitions("ingest_batches", [partition])
    main_before = local_lake.resolve_ref(MAIN_BRANCH)
    job = dg.reconstructable(reexecution_job.get_job)
    tags = {"dagster/partition": partition}

    failed = dg.execute_job(job, instance, tags=tags, raise_on_error=False)
    assert not failed.success
    bypass = dg.execute_job(
        job,
        instance,
        tags=tags,
        raise_on_error=False,
        reexecution_options=dg.ReexecutionOptions(
            parent_run_id=failed.run_id, step_selection=["published_ingest"]
        ),
    )

    assert not bypass.success
    errors = [e.step_failure_data.error.to_string() for e in bypass.all_events if e.is_step_failure]
    assert any(
        "refusing to publish to main" in m and "gx_scene_index_ranges: failed" in m for m in errors
    )
    assert local_lake.resolve_ref(MAIN_BRANCH) == main_before
    assert scene_index_view(local_lake).empty


def test_fixed_reupload_of_a_quarantined_log_lifts_its_quarantine(
    local_lake, instance, ingest_resources
):
    good = make_synthetic_log(seed=14)
    bad = land(local_lake, "b-fix", [("log", encode_drive_log(good)[:-500])])
    materialize_partition(instance, ingest_resources, partition_of(bad))
    assert len(quarantine_view(local_lake)) == 1

    fixed = land(local_lake, "b-fix", [("log", good)])  # same key, repaired content
    result = materialize_partition(instance, ingest_resources, partition_of(fixed))

    assert result.success
    assert quarantine_view(local_lake).empty
    assert len(scene_index_view(local_lake)) == len(good.frames)


def test_quarantined_logs_are_judged_again_after_a_rule_is_fixed(
    local_lake, instance, ingest_resources, tmp_path, monkeypatch
):
    # A too-strict rule quarantines a good 20-frame log ...
    _strict_resources(tmp_path, monkeypatch, "logs.yaml", "min_frames: 5", "min_frames: 30")
    batch = land(
        local_lake,
        "b-rule",
        [
            ("short", make_synthetic_log(seed=24)),
            ("cut", encode_drive_log(make_synthetic_log(seed=25))[:-500]),
        ],
    )
    first = materialize_partition(instance, ingest_resources, partition_of(batch))
    assert set(verdicts_of(first).values()) == {"quarantined"}
    monkeypatch.delenv("AIINFRA_RESOURCES")  # ... the operator fixes the rule and deploys

    plain = materialize_partition(instance, ingest_resources, partition_of(batch))
    assert set(verdicts_of(plain).values()) == {"already_ingested"}  # a plain re-run: no change
    fixed = materialize_partition(
        instance,
        ingest_resources,
        partition_of(batch),
        run_config={"ops": {"ingest_batch": {"config": {"revalidate_quarantined": True}}}},
    )

    assert verdicts_of(fixed) == {"logs/cut.mcap": "quarantined", "logs/short.mcap": "accepted"}
    assert list(quarantine_view(local_lake)["log_key"]) == ["logs/cut.mcap"]
    assert set(scene_index_view(local_lake)["log_key"]) == {"logs/short.mcap"}
