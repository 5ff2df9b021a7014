"""The car's outbox on a real LocalLake: priority order under a budget, the upload window,
eviction under the cache cap, and power cuts (SIGKILL) mid-upload that lose and duplicate
nothing."""

from __future__ import annotations

import copy
import json
import os
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from aiinfra_pipelines.config import load_resource_yaml, resources_dir
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.vehicle.outbox import EVICTED, QUEUED, UPLOADED, Outbox
from aiinfra_pipelines.vehicle.outbox_settings import OutboxSettings

PART = 1024
VEHICLE = yaml.safe_load((resources_dir() / "vehicle.yaml").read_text())


def config(**outbox) -> dict:
    """vehicle.yaml with small parts (LocalLake's minimum lowered to match) and overrides."""
    changed = copy.deepcopy(VEHICLE)
    changed["outbox"].update({"part_bytes": PART, **outbox})
    return changed


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def lake(tmp_path: Path) -> LocalLake:
    lake = LocalLake(root=str(tmp_path / "lake"), upload_min_part_bytes=PART)
    lake.ensure_repository()
    return lake


def log(size: int, seed: int) -> bytes:
    return bytes((i * 31 + seed * 7) % 251 for i in range(size))


def test_every_trigger_rule_has_a_priority_class():
    settings = OutboxSettings.load()
    rules = set(load_resource_yaml("triggers.yaml")["rules"])
    assert rules <= settings.classified_rules, rules - settings.classified_rules
    assert settings.class_of(["fog", "near_collision"]).name == "urgent"
    assert settings.class_of(["night"]).name == "bulk"
    bad = config()
    bad["outbox"]["classes"][1]["rules"].append("fog")
    with pytest.raises(ValueError, match=r"\['fog'\] are in two classes"):
        OutboxSettings.load(bad)


def test_urgent_logs_go_first_and_the_budget_and_window_hold_back_the_rest(lake, tmp_path):
    clock = Clock()
    # Budget: 5 KiB a day. Queued oldest first: bulk, normal, urgent, normal.
    outbox = Outbox(
        tmp_path / "car", OutboxSettings.load(config(daily_budget_bytes=5 * PART)), clock
    )
    outbox.enqueue("bulk-1", log(2 * PART, 1), ["night"])
    outbox.enqueue("normal-1", log(2 * PART, 2), ["hard_brake"])
    outbox.enqueue("urgent-1", log(4 * PART, 3), ["near_collision", "night"])
    outbox.enqueue("normal-2", log(2 * PART, 4), ["low_ttc"])

    first = outbox.drain(lake, "ingest-car1-d1", window_open=False)
    # Urgent first (4 KiB), then one part of normal-1 fits the day's last KiB; normal-2 waits.
    assert [log_id for log_id, _ in outbox.transfers()] == ["urgent-1"] * 4 + ["normal-1"]
    assert first.uploaded == ["urgent-1"] and first.stopped_by == "daily budget reached"
    assert outbox.states() == {
        "bulk-1": QUEUED,
        "normal-1": "uploading",
        "urgent-1": UPLOADED,
        "normal-2": QUEUED,
    }
    assert lake.get_object("ingest-car1-d1", "logs/urgent-1.mcap") == log(4 * PART, 3)
    assert lake.log("ingest-car1-d1", limit=1)[0].metadata["log_count"] == "1"
    # An urgent log that arrives over budget still goes at once.
    outbox.enqueue("urgent-2", log(PART, 5), ["takeover"])
    assert outbox.drain(lake, "ingest-car1-d1", window_open=False).uploaded == ["urgent-2"]

    clock.now += timedelta(days=1)  # a new day's budget; parked on Wi-Fi
    second = outbox.drain(lake, "ingest-car1-d2", window_open=True)
    # Class before age: the older bulk log goes after both normal ones.
    assert second.uploaded == ["normal-1", "normal-2", "bulk-1"]
    # normal-1 finished on the branch its upload began on; the others on the new batch.
    assert lake.object_exists("ingest-car1-d1", "logs/normal-1.mcap")
    assert [o.key for o in lake.list_objects("ingest-car1-d2", "logs/")] == [
        "logs/bulk-1.mcap",
        "logs/normal-2.mcap",
    ]
    assert set(second.commits) == {"ingest-car1-d1", "ingest-car1-d2"}
    status = outbox.status()
    assert status["backlog"] == {} and status["sent_today_bytes"] == 5 * PART
    sent = {"urgent": 5 * PART, "normal": 4 * PART, "bulk": 2 * PART}
    assert status["bytes_sent_by_class"] == sent


def test_over_the_cache_cap_the_lowest_class_and_oldest_log_is_evicted_never_urgent(lake, tmp_path):
    outbox = Outbox(tmp_path / "car", OutboxSettings.load(config(cache_cap_bytes=6 * PART)))
    outbox.enqueue("bulk-old", log(2 * PART, 1), ["fog"])
    outbox.enqueue("normal-1", log(2 * PART, 2), ["lane_change"])
    outbox.enqueue("bulk-new", log(2 * PART, 3), ["rain"])
    assert outbox.status()["evictions"] == []  # exactly at the cap
    outbox.enqueue("urgent-1", log(3 * PART, 4), ["near_collision"])  # 9 KiB > 6 KiB
    states = outbox.states()
    assert states["bulk-old"] == EVICTED and states["bulk-new"] == EVICTED
    assert states["normal-1"] == QUEUED and states["urgent-1"] == QUEUED
    evictions = outbox.status()["evictions"]
    assert [e["log_id"] for e in evictions] == ["bulk-old", "bulk-new"]
    assert all("over its cap" in e["reason"] and e["priority"] == "bulk" for e in evictions)
    assert not (tmp_path / "car" / "data" / "bulk-old.bin").exists()
    outbox.enqueue("urgent-2", log(6 * PART, 5), ["takeover"])  # urgent: never evicted
    states = outbox.states()
    assert states["normal-1"] == EVICTED
    assert states["urgent-1"] == QUEUED and states["urgent-2"] == QUEUED
    report = outbox.drain(lake, "ingest-car1", window_open=True)
    assert report.uploaded == ["urgent-1", "urgent-2"]


def _run_child(tmp_path: Path, lake: LocalLake, settings: dict, event: str, after: int):
    args = {
        "lake_root": lake.root,
        "min_part_bytes": PART,
        "folder": str(tmp_path / "car"),
        "config": settings,
        "branch": "ingest-car1",
        "kill_event": event,
        "kill_after": after,
    }
    return subprocess.run(
        [sys.executable, "-m", "aiinfra_pipelines_tests.vehicle._outbox_child", json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )


@pytest.mark.parametrize(
    ("event", "after", "recorded"), [("part", 7, 7), ("acknowledged", 7, 6), ("completed", 1, 5)]
)
def test_a_power_cut_mid_upload_loses_nothing_and_sends_nothing_twice(
    lake, tmp_path, event, after, recorded
):
    """SIGKILL after the 7th acknowledged part was recorded (mid-log), after the lake
    acknowledged the 7th part but before the outbox recorded it, or right after the lake joined
    the first log but before the outbox recorded it; a restarted outbox finishes the job, and
    its transfer records (what the daily budget counts) hold every part that went over the air
    exactly once."""
    settings = config()
    outbox = Outbox(tmp_path / "car", OutboxSettings.load(settings))
    logs = {f"log-{i}": log(4 * PART + 100 * (i + 1), i) for i in range(3)}  # 5 parts each
    for log_id, data in logs.items():
        outbox.enqueue(log_id, data, ["hard_brake"])

    child = _run_child(tmp_path, lake, settings, event, after)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    before = Outbox(tmp_path / "car", OutboxSettings.load(settings)).transfers()
    assert len(before) == recorded

    restarted = Outbox(tmp_path / "car", OutboxSettings.load(settings))
    report = restarted.drain(lake, "ingest-car1", window_open=True)
    assert restarted.states() == dict.fromkeys(logs, UPLOADED)
    # After 7 parts log-0 was done and recorded; a log joined but not recorded before the cut
    # is recognised on the branch (``recovered``, below) and counts as finished now.
    assert report.uploaded == (list(logs) if event == "completed" else ["log-1", "log-2"])
    for log_id, data in logs.items():
        assert lake.get_object("ingest-car1", f"logs/{log_id}.mcap") == data
    sent = restarted.transfers()
    assert len(sent) == len(set(sent)) == 15  # every part once, none twice
    assert _transferred_bytes(tmp_path / "car") == sum(len(data) for data in logs.values())
    assert lake.uncommitted("ingest-car1") == []  # one commit holds them all
    assert not list((Path(lake.root) / "uploads").glob("*/upload.json"))  # no open upload left
    if event == "completed":
        events = [json.loads(row) for row in _events(tmp_path / "car", "uploaded")]
        assert events[0]["recovered"] is True  # found on the branch, not sent again


def test_a_drain_commits_what_a_run_cut_before_its_commit_left_staged(lake, tmp_path):
    """SIGKILL after every log completed and was recorded (cached bytes deleted) but before the
    commit: the next ``drain(commit=True)``, with nothing left to send and another batch
    branch, commits the stranded uploads where they lie."""
    settings = config()
    outbox = Outbox(tmp_path / "car", OutboxSettings.load(settings))
    logs = {f"log-{i}": log(2 * PART + 10 * i, i) for i in range(2)}
    for log_id, data in logs.items():
        outbox.enqueue(log_id, data, ["hard_brake"])

    child = _run_child(tmp_path, lake, settings, "commit", 1)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert outbox.states() == dict.fromkeys(logs, UPLOADED)
    assert len(lake.uncommitted("ingest-car1")) == len(logs)

    report = Outbox(tmp_path / "car", OutboxSettings.load(settings)).drain(
        lake, "ingest-car1-next", window_open=True
    )

    assert report.uploaded == [] and report.parts_sent == 0
    assert list(report.commits) == ["ingest-car1"]
    assert lake.uncommitted("ingest-car1") == []
    for log_id, data in logs.items():
        assert lake.get_object(report.commits["ingest-car1"], f"logs/{log_id}.mcap") == data


def _transferred_bytes(folder: Path) -> int:
    with sqlite3.connect(folder / "outbox.sqlite3") as db:
        return db.execute("SELECT COALESCE(SUM(bytes), 0) FROM transfers").fetchone()[0]


def _events(folder: Path, kind: str) -> list[str]:
    with sqlite3.connect(folder / "outbox.sqlite3") as db:
        return [
            row[0]
            for row in db.execute("SELECT detail FROM events WHERE kind = ? ORDER BY id", (kind,))
        ]
