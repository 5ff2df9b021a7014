"""Each mining rule fires on hand-built predictions exactly when it should, and combines."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.mining.rules import (
    BADCASE_COLUMNS,
    badcase_summary,
    flip_counts,
    mine_badcases,
    score_frames,
)
from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import Predictions

FRAME_NS = 200_000_000  # 5 Hz


def make_frames(logs: dict[str, int], slice_: str = "day/clear/highway") -> pd.DataFrame:
    lighting, weather, road_type = slice_.split("/")
    rows = []
    for log_id, n in logs.items():
        for i in range(n):
            rows.append(
                {
                    "log_id": log_id,
                    "frame_index": i,
                    "timestamp_ns": 1_000_000_000_000 + i * FRAME_NS,
                    "slice": slice_,
                    "lighting": lighting,
                    "weather": weather,
                    "road_type": road_type,
                }
            )
    return pd.DataFrame(rows)


def clean(n: int, spec: PerceptionSpec) -> tuple[Predictions, tuple[np.ndarray, np.ndarray]]:
    """Confident predictions identical to their labels every frame: no rule may fire."""
    label = np.zeros((n, 3, spec.bins), dtype=np.float32)
    label[:, 0, :] = 1.0  # leftmost lane: no road to the left
    gap_norm = np.full(n, 0.4, dtype=np.float32)
    probs = np.where(label > 0.5, 0.99, 0.01).astype(np.float32)
    predictions = Predictions(
        occupancy=probs,
        lead_gap_m=gap_norm * spec.max_range_m,
        confidence=np.full(n, 0.98, dtype=np.float32),
    )
    return predictions, (label, gap_norm)


def with_(predictions: Predictions, **changes: Any) -> Predictions:
    fields = {
        "occupancy": predictions.occupancy.copy(),
        "lead_gap_m": predictions.lead_gap_m.copy(),
        "confidence": predictions.confidence.copy(),
    }
    fields.update(changes)
    return Predictions(**fields)


def reasons_by_frame(badcases: pd.DataFrame) -> dict[tuple[str, int], str]:
    return {
        (log, int(frame)): reasons
        for log, frame, reasons in badcases[["log_id", "frame_index", "reasons"]].itertuples(
            index=False
        )
    }


def test_clean_predictions_mine_nothing(spec, config):
    frames = make_frames({"a": 6})
    predictions, labels = clean(6, spec)
    badcases = mine_badcases(frames, None, predictions, labels, config, spec=spec)
    assert badcases.empty
    assert list(badcases.columns) == list(BADCASE_COLUMNS)


def test_low_confidence_fires_only_below_threshold(spec, config):
    threshold = config["rules"]["low_confidence"]["threshold"]
    frames = make_frames({"a": 4})
    predictions, labels = clean(4, spec)
    confidence = np.array([0.98, threshold - 0.01, threshold, threshold + 0.2], dtype=np.float32)
    badcases = mine_badcases(
        frames, None, with_(predictions, confidence=confidence), labels, config, spec=spec
    )
    assert reasons_by_frame(badcases) == {("a", 1): "low_confidence"}
    assert badcases["confidence"].iloc[0] == pytest.approx(threshold - 0.01)


def test_temporal_instability_counts_flips_between_consecutive_frames(spec, config):
    k = config["rules"]["temporal_instability"]["min_flipped_cells"]
    frames = make_frames({"a": 5})
    predictions, labels = clean(5, spec)
    occupancy = predictions.occupancy.copy()
    occupancy[2, 1, :k] = 0.99  # frame 2 gains k cells, frame 3 loses them again
    occupancy[4, 2, : k - 1] = 0.99  # k - 1 flips: below the rule
    config["rules"]["label_disagreement"]["enabled"] = False  # isolate the flip rule
    scored = score_frames(
        frames, None, with_(predictions, occupancy=occupancy), labels, config, spec=spec
    )
    assert scored["flip_count"].tolist() == [0, 0, k, k, k - 1]
    assert scored["reasons"].tolist() == ["", "", *["temporal_instability"] * 2, ""]


def test_temporal_instability_respects_log_boundaries_and_time_order(spec, config):
    """Two logs interleaved and shuffled: a flip is only counted against the same log's
    previous frame in time, never across logs and never in row order."""
    frames = make_frames({"a": 3, "b": 3})
    predictions, _ = clean(6, spec)
    occupancy = predictions.occupancy.copy()
    occupancy[3:, 2, :] = 0.99  # log b differs from log a in all 6 right-lane cells
    shuffled = np.array([4, 0, 3, 2, 5, 1])  # rows alternate b/a, times within a log scrambled
    frames = frames.iloc[shuffled].reset_index(drop=True)
    occupancy = occupancy[shuffled]
    counts = flip_counts(frames, occupancy >= 0.5, max_frame_gap_s=0.5)
    assert counts.tolist() == [0] * 6  # each log is constant in time

    # One genuine flip in log b, at its frame 2, is attributed to that frame only.
    b2 = int(np.flatnonzero((frames["log_id"] == "b") & (frames["frame_index"] == 2))[0])
    occupancy[b2, 1, :4] = 0.99
    counts = flip_counts(frames, occupancy >= 0.5, max_frame_gap_s=0.5)
    assert counts[b2] == 4
    assert counts.sum() == 4


def test_frames_across_a_segment_gap_are_not_compared(spec, config):
    frames = make_frames({"a": 2})
    frames.loc[1, "timestamp_ns"] += 5_000_000_000  # next uploaded segment, 5 s later
    predictions, _ = clean(2, spec)
    occupancy = predictions.occupancy.copy()
    occupancy[1, 1:, :] = 0.99
    counts = flip_counts(
        frames, occupancy >= 0.5, config["rules"]["temporal_instability"]["max_frame_gap_s"]
    )
    assert counts.tolist() == [0, 0]


def test_label_disagreement_on_cells_and_on_lead_gap(spec, config):
    rule = config["rules"]["label_disagreement"]
    cells = 3 * spec.bins
    frames = make_frames({"a": 4})
    predictions, labels = clean(4, spec)
    occupancy = predictions.occupancy.copy()
    too_many = int(np.floor(rule["max_cell_disagreement"] * cells)) + 1
    tolerated = int(np.floor(rule["max_cell_disagreement"] * cells))
    occupancy[1, 1:].reshape(-1)[:too_many] = 0.99
    occupancy[2, 1:].reshape(-1)[:tolerated] = 0.99
    gap = predictions.lead_gap_m.copy()
    gap[3] += rule["max_lead_gap_error_m"] + 1.0
    gap[2] += rule["max_lead_gap_error_m"] - 1.0
    config["rules"]["temporal_instability"]["enabled"] = False
    scored = score_frames(
        frames,
        None,
        with_(predictions, occupancy=occupancy, lead_gap_m=gap),
        labels,
        config,
        spec=spec,
    )
    assert scored["disagreement"].tolist() == pytest.approx(
        [0.0, too_many / cells, tolerated / cells, 0.0]
    )
    assert scored["lead_gap_error_m"].iloc[3] == pytest.approx(rule["max_lead_gap_error_m"] + 1)
    assert scored["reasons"].tolist() == ["", "label_disagreement", "", "label_disagreement"]


def _index(frames: pd.DataFrame, flags: dict[str, list[bool]]) -> pd.DataFrame:
    index = frames[["log_id", "frame_index"]].copy()
    for rule, values in flags.items():
        index[f"event_{rule}"] = values
    index["events"] = [
        ",".join(r for r, values in sorted(flags.items()) if values[i]) for i in range(len(frames))
    ]
    return index


def test_logged_events_come_from_index_flags_of_counted_rules(spec, config):
    assert {"near_collision", "hard_brake", "low_ttc"} <= set(
        config["rules"]["logged_event"]["rules"]
    )
    frames = make_frames({"a": 4})
    predictions, labels = clean(4, spec)
    index = _index(
        frames,
        {
            "near_collision": [False, True, False, False],
            "hard_brake": [False, True, False, True],
            "lane_change": [False, False, True, False],  # logged, but not a badcase rule
            # no event_takeover column: the simulated fleet has no takeover rule
        },
    )
    badcases = mine_badcases(frames, index, predictions, labels, config, spec=spec)
    assert reasons_by_frame(badcases) == {("a", 1): "logged_event", ("a", 3): "logged_event"}
    assert badcases["events"].tolist() == ["hard_brake,near_collision", "hard_brake"]


def test_events_only_count_at_their_own_frame_and_log(spec, config):
    frames = make_frames({"a": 2, "b": 2})
    predictions, labels = clean(4, spec)
    index = _index(frames, {"low_ttc": [False, False, True, False]})
    index = index.iloc[::-1].reset_index(drop=True)  # the join is by key, not by row order
    badcases = mine_badcases(frames, index, predictions, labels, config, spec=spec)
    assert reasons_by_frame(badcases) == {("b", 0): "logged_event"}


def test_multiple_reasons_combine_sorted(spec, config):
    frames = make_frames({"a": 3})
    predictions, labels = clean(3, spec)
    occupancy = predictions.occupancy.copy()
    occupancy[2, 1:, :] = 0.99  # 12 flipped cells: unstable and wrong
    confidence = predictions.confidence.copy()
    confidence[2] = 0.1
    index = _index(frames, {"near_collision": [False, False, True]})
    badcases = mine_badcases(
        frames,
        index,
        with_(predictions, occupancy=occupancy, confidence=confidence),
        labels,
        config,
        spec=spec,
    )
    assert badcases["reasons"].tolist() == [
        "label_disagreement,logged_event,low_confidence,temporal_instability"
    ]
    row = badcases.iloc[0]
    assert (row["log_id"], row["frame_index"], row["slice"]) == ("a", 2, "day/clear/highway")
    assert row["flip_count"] == 2 * spec.bins


def test_disabled_rule_never_fires(spec, config):
    config["rules"]["low_confidence"]["enabled"] = False
    frames = make_frames({"a": 2})
    predictions, labels = clean(2, spec)
    confidence = np.zeros(2, dtype=np.float32)
    badcases = mine_badcases(
        frames, None, with_(predictions, confidence=confidence), labels, config, spec=spec
    )
    assert badcases.empty


def test_slice_tags_come_from_the_scene_index(spec, config):
    frames = make_frames({"a": 2})[["log_id", "frame_index", "timestamp_ns"]]  # no tags
    index = frames[["log_id", "frame_index"]].assign(
        lighting="night", weather="rain", road_type="merge", slice="night/rain/merge"
    )
    predictions, labels = clean(2, spec)
    confidence = np.zeros(2, dtype=np.float32)
    badcases = mine_badcases(
        frames, index, with_(predictions, confidence=confidence), labels, config, spec=spec
    )
    assert badcases["slice"].tolist() == ["night/rain/merge"] * 2
    assert badcases["weather"].tolist() == ["rain"] * 2


def test_misaligned_predictions_are_refused(spec, config):
    frames = make_frames({"a": 3})
    predictions, labels = clean(2, spec)
    with pytest.raises(ValueError, match="row-aligned"):
        mine_badcases(frames, None, predictions, labels, config, spec=spec)


def test_badcase_summary_counts_per_slice_reason_and_event(spec, config):
    frames = pd.concat(
        [make_frames({"a": 2}, "day/clear/highway"), make_frames({"n": 3}, "night/fog/merge")],
        ignore_index=True,
    )
    predictions, labels = clean(5, spec)
    confidence = np.array([0.1, 0.98, 0.1, 0.1, 0.98], dtype=np.float32)
    index = _index(frames, {"hard_brake": [True, True, False, False, False]})
    badcases = mine_badcases(
        frames, index, with_(predictions, confidence=confidence), labels, config, spec=spec
    )
    summary = badcase_summary(badcases)
    assert summary["badcases"] == 4
    assert summary["logs"] == 2
    assert summary["per_slice"] == {"day/clear/highway": 2, "night/fog/merge": 2}
    assert summary["per_reason"] == {"logged_event": 2, "low_confidence": 3}
    assert summary["per_event"] == {"hard_brake": 2}
    assert badcase_summary(badcases.iloc[0:0])["badcases"] == 0


def test_reads_the_real_scene_index_schema(fleet, spec, config):
    """The index as ingestion builds it (``scene_index_table``): per-frame event flags and tags."""
    from aiinfra_pipelines.ingest.tables import scene_index_table, trigger_rule_names
    from aiinfra_pipelines.perception.labels import ground_truth_labels

    log_id = sorted(fleet["log_id"].unique())[0]
    frames = fleet[fleet["log_id"] == log_id].reset_index(drop=True)
    timestamps = frames["timestamp_ns"].tolist()
    index = scene_index_table(
        frames,
        tags={
            "log_id": log_id,
            "lighting": "night",
            "weather": "rain",
            "road_type": "merge",
        },
        events=[(timestamps[3], "hard_brake"), (timestamps[5], "lane_change")],
        rule_names=trigger_rule_names(),
        source_branch="main",
        source_commit="c0",
        log_key="k",
        frames_object="o",
    )
    frames = frames.drop(columns=["slice", "lighting", "weather", "road_type", "events"])
    labels = ground_truth_labels(frames, spec)
    perfect = Predictions(
        occupancy=np.where(labels[0] > 0.5, 0.99, 0.01).astype(np.float32),
        lead_gap_m=labels[1] * spec.max_range_m,
        confidence=np.full(len(frames), 0.98, dtype=np.float32),
    )
    config["rules"]["temporal_instability"]["enabled"] = False  # real traffic moves
    badcases = mine_badcases(frames, index, perfect, labels, config, spec=spec)
    assert badcases["frame_index"].tolist() == [3]  # lane_change is logged but not counted
    assert badcases["events"].tolist() == ["hard_brake"]
    assert badcases["slice"].tolist() == ["night/rain/merge"]
