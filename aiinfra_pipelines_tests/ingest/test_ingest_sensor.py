"""``lakefs_ingest_sensor`` evaluated against a real instance with ``build_sensor_context``."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.runs import LOG_COUNT_TAG, SOURCE_COMMIT_TAG
from aiinfra_pipelines.sensors.ingest_sensor import lakefs_ingest_sensor
from aiinfra_pipelines_tests.support.ingest_runs import land


def _tick(instance, lake, cursor=None) -> dg.SensorResult:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake})
    return lakefs_ingest_sensor(context)


def _partition_keys(result: dg.SensorResult) -> list[str]:
    return sorted(
        key for request in result.dynamic_partitions_requests for key in request.partition_keys
    )


def test_a_landed_batch_becomes_one_run_and_one_partition(instance, local_lake):
    batch = land(
        local_lake, "s1", [("a", make_synthetic_log(seed=1)), ("b", make_synthetic_log(seed=2))]
    )

    result = _tick(instance, local_lake)

    # Partitions grow with batches, never with logs.
    (request,) = result.run_requests
    assert request.partition_key == f"{batch.branch}/{batch.commit}"
    assert _partition_keys(result) == [request.partition_key]
    assert request.tags[SOURCE_COMMIT_TAG] == batch.commit
    assert request.tags[LOG_COUNT_TAG] == "2"


def test_duplicate_tick_requests_nothing_and_run_keys_are_stable(instance, local_lake):
    land(local_lake, "s2", [("a", make_synthetic_log(seed=3))])
    first = _tick(instance, local_lake)

    repeated = _tick(instance, local_lake, cursor=first.cursor)
    assert repeated.run_requests == []
    assert repeated.dynamic_partitions_requests == []
    # Even a tick that lost its cursor asks for the same run keys, which the daemon dedupes.
    lost_cursor = _tick(instance, local_lake, cursor=None)
    assert [r.run_key for r in lost_cursor.run_requests] == [r.run_key for r in first.run_requests]


def test_commits_landed_while_sensor_was_stopped_are_all_picked_up(instance, local_lake):
    first = _tick(instance, local_lake)
    assert first.run_requests == []
    landed = []
    for batch in range(3):  # the daemon is down while three uploads land on one branch ...
        logs = [(f"log{batch}-{i}", make_synthetic_log(seed=10 * batch + i)) for i in range(2)]
        landed.append(land(local_lake, "while-down", logs))
    other = land(local_lake, "other", [("x", make_synthetic_log(seed=99))])  # ... one elsewhere

    after_restart = _tick(instance, local_lake, cursor=first.cursor)

    # One batch per upload commit, each with only the logs that commit landed.
    keys = sorted(r.partition_key for r in after_restart.run_requests)
    assert keys == sorted(f"{b.branch}/{b.commit}" for b in [*landed, other])
    counts = {r.partition_key: r.tags[LOG_COUNT_TAG] for r in after_restart.run_requests}
    assert set(counts.values()) == {"2", "1"}
    assert _tick(instance, local_lake, cursor=after_restart.cursor).run_requests == []


def test_only_commits_after_the_cursor_are_diffed(instance, local_lake):
    land(local_lake, "inc", [("old", make_synthetic_log(seed=1))])
    first = _tick(instance, local_lake)
    newer = land(local_lake, "inc", [("new", make_synthetic_log(seed=2))])

    second = _tick(instance, local_lake, cursor=first.cursor)

    assert [r.partition_key for r in second.run_requests] == [f"ingest-inc/{newer.commit}"]
    assert second.run_requests[0].tags[SOURCE_COMMIT_TAG] == newer.commit
    assert second.run_requests[0].tags[LOG_COUNT_TAG] == "1"
