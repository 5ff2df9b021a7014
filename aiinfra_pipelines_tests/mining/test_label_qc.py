"""Label QC: agreement of the teacher with an independent labeller, and the held-back list."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd

from aiinfra_pipelines.mining.label_qc import (
    AGREEMENT_COLUMNS,
    agreement_scores,
    geometric_labels,
    held_back_frames,
    human_check,
    label_agreement,
    qc_summary,
)
from aiinfra_pipelines.mining.settings import LabelQcSettings
from aiinfra_pipelines.perception.labels import ground_truth_labels


def no_human_check(config):
    config["label_qc"]["human_check_fraction"] = 0.0
    return config


def test_identical_labellers_agree_completely(fleet, spec, config):
    result = label_agreement(fleet, spec, no_human_check(config), independent=ground_truth_labels)
    assert list(result.columns) == list(AGREEMENT_COLUMNS)
    assert len(result) == len(fleet)
    assert (result["agreement"] == 1.0).all()
    assert not result["held_back"].any()
    assert (result["reason"] == "").all()
    assert qc_summary(result)["mean_agreement"] == 1.0


def test_injected_noise_lowers_agreement_and_holds_frames_back(fleet, spec, config):
    config["label_qc"].update(human_check_fraction=1.0, human_flip_probability=0.25)
    noisy = label_agreement(fleet, spec, config, independent=ground_truth_labels)
    assert noisy["human_checked"].all()
    assert (noisy["labeller"] == "human_check").all()
    # 18 cells flipped with p = 0.25: expected agreement 0.75, far below the 0.85 threshold.
    assert 0.65 < noisy["agreement"].mean() < 0.85
    assert noisy["held_back"].mean() > 0.5
    held = held_back_frames(noisy)
    assert len(held) == int(noisy["held_back"].sum())
    assert (held["agreement"] < config["label_qc"]["agreement_threshold"]).all()
    assert set(held["reason"]) == {"occupancy_disagreement"}

    config["label_qc"]["human_flip_probability"] = 0.0  # a flawless reviewer agrees again
    exact = label_agreement(fleet, spec, config, independent=ground_truth_labels)
    assert (exact["agreement"] == 1.0).all()


def test_frames_below_threshold_are_held_back_and_listed(fleet, spec, config):
    frames = fleet.iloc[:10].reset_index(drop=True)
    cells = 3 * spec.bins

    def disagrees_on_frames_2_and_7(frames: pd.DataFrame, spec):
        occupancy, gap = ground_truth_labels(frames, spec)
        occupancy = occupancy.copy()
        flat = occupancy.reshape(len(frames), -1)
        flat[2, :4] = 1.0 - flat[2, :4]  # 4 of 18 cells: agreement 0.78 < 0.85
        flat[7, :2] = 1.0 - flat[7, :2]  # 2 of 18 cells: 0.89, kept
        gap = gap.copy()
        gap[5] = (gap[5] * spec.max_range_m + 30.0) / spec.max_range_m  # lead gaps 30 m apart
        return occupancy, gap

    result = label_agreement(
        frames, spec, no_human_check(config), independent=disagrees_on_frames_2_and_7
    )
    assert result["disagreeing_cells"].tolist() == [0, 0, 4, 0, 0, 0, 0, 2, 0, 0]
    assert result.loc[2, "agreement"] == (cells - 4) / cells
    assert result["held_back"].tolist() == [i in (2, 5) for i in range(10)]
    held = held_back_frames(result)
    assert held["frame_index"].tolist() == frames["frame_index"].iloc[[2, 5]].tolist()
    assert held["reason"].tolist() == ["occupancy_disagreement", "lead_gap_disagreement"]
    summary = qc_summary(result)
    assert summary["held_back"] == 2
    assert sum(s["held_back"] for s in summary["per_slice"].values()) == 2


def test_independent_labeller_agrees_with_teacher_on_most_fleet_frames(fleet, spec, config):
    teacher = ground_truth_labels(fleet, spec)
    qc = LabelQcSettings.load(config)
    independent = geometric_labels(fleet, spec, qc.lane_width_m, qc.flow_alignment)
    agreement = agreement_scores(teacher[0], independent[0])
    raw = geometric_labels(fleet, spec, qc.lane_width_m, None)
    raw_agreement = agreement_scores(teacher[0], raw[0])
    print(
        f"\ngeometric labeller vs teacher on {len(fleet)} fleet frames: mean cell agreement "
        f"{agreement.mean():.4f} (without flow alignment {raw_agreement.mean():.4f}), "
        f"frames in full agreement {np.mean(agreement == 1.0):.3f}, "
        f"below threshold {np.mean(agreement < qc.agreement_threshold):.3f}"
    )
    assert agreement.mean() > 0.98
    assert np.mean(agreement == 1.0) > 0.9
    assert np.mean(agreement < qc.agreement_threshold) < 0.05
    assert agreement.mean() > raw_agreement.mean()  # flow alignment fixes lane-change frames

    result = label_agreement(fleet, spec, config)  # the production configuration
    summary = qc_summary(result)
    print(f"label_agreement summary: {json.dumps(summary)}")
    assert summary["mean_agreement"] > 0.97
    assert summary["held_back_share"] < 0.05
    assert 0 < summary["human_checked"] < len(fleet) * 0.3


def _frame(others: list[dict], speed: float = 20.0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "log_id": "log",
                "frame_index": 0,
                "ground_truth": json.dumps(others),
                "lane_index": 1,
                "lane_count": 3,
                "speed_mps": speed,
            }
        ]
    )


def test_flow_alignment_keeps_lane_assignment_when_ego_is_yawed(spec, config):
    """Ego yawed 0.12 rad into a lane change: a car 40 m ahead in its lane appears ~4.8 m to
    the right in the ego frame. Traffic flowing along the road reveals the road axis."""
    yaw = 0.12
    road_to_ego = np.array([[math.cos(yaw), math.sin(yaw)], [-math.sin(yaw), math.cos(yaw)]])
    others = []
    for vehicle_id, (x_road, y_road) in enumerate([(40.0, 0.0), (20.0, 4.0), (-5.0, -4.0)]):
        x, y = road_to_ego @ np.array([x_road, y_road])
        # Everyone drives along the road at ego's speed: relative velocity cancels ego's.
        vx, vy = road_to_ego @ np.array([20.0, 0.0]) - np.array([20.0, 0.0])
        others.append({"vehicle_id": vehicle_id, "x": x, "y": y, "vx": vx, "vy": vy})
    frame = _frame(others)
    qc = LabelQcSettings.load(config)
    aligned, aligned_gap = geometric_labels(frame, spec, qc.lane_width_m, qc.flow_alignment)
    raw, _ = geometric_labels(frame, spec, qc.lane_width_m, None)
    bin_40m = int(np.searchsorted(spec.bin_edges_m, 40.0, side="right")) - 1
    assert aligned[0, 1, bin_40m] == 1.0  # ego lane
    assert raw[0, 2, bin_40m] == 1.0 and raw[0, 1, bin_40m] == 0.0  # misread as right lane
    assert abs(aligned_gap[0] * spec.max_range_m - 40.0) < 1e-3  # lead gap along the road


def test_human_check_sample_is_seeded_per_frame_not_per_batch(fleet, spec, config):
    qc = replace(LabelQcSettings.load(config), human_check_fraction=0.3, human_flip_probability=0.3)
    occupancy = ground_truth_labels(fleet, spec)[0]
    checked, reviewed = human_check(fleet, occupancy, qc)
    assert 0 < checked.sum() < len(fleet)
    assert (reviewed[~checked] == occupancy[~checked]).all()
    # QC'ing the last 40 frames on their own gives those frames the same verdicts.
    tail = fleet.iloc[-40:].reset_index(drop=True)
    tail_checked, tail_reviewed = human_check(tail, occupancy[-40:], qc)
    assert (tail_checked == checked[-40:]).all()
    assert (tail_reviewed == reviewed[-40:]).all()
    other_seed, _ = human_check(fleet, occupancy, replace(qc, seed=qc.seed + 1))
    assert (other_seed != checked).any()


def test_junction_frames_are_reported_not_judged_instead_of_held_back(fleet, spec, config):
    """A straight-lane labeller cannot judge a curving lane: on the road types outside
    ``judged_road_types`` a disagreement holds nothing back, and the report says QC did not
    look there; on highway and merge the same disagreement still holds frames back."""

    def disagrees_everywhere(frames: pd.DataFrame, spec):
        occupancy, gap = ground_truth_labels(frames, spec)
        return 1.0 - occupancy, np.clip(gap + 0.5, 0.0, 1.0)

    frames = fleet.copy()
    logs = sorted(frames["log_id"].unique())
    junction = frames["log_id"].isin(logs[::2])  # tag every other log as a roundabout drive
    frames.loc[junction, "slice"] = (
        frames.loc[junction, "slice"].str.rsplit("/", n=1).str[0] + "/roundabout"
    )
    result = label_agreement(frames, spec, no_human_check(config), independent=disagrees_everywhere)
    road = result["slice"].str.rsplit("/", n=1).str[-1]
    judged = road.isin(config["label_qc"]["judged_road_types"])
    assert judged.any() and (~judged).any(), set(road)
    assert result.loc[judged, "held_back"].all()
    assert not result.loc[~judged, "held_back"].any()
    assert (result.loc[~judged, "labeller"] == "not_judged").all()
    assert (result.loc[~judged, "reason"] == "").all()
    summary = qc_summary(result)
    assert summary["judged"] == int(judged.sum()) == summary["held_back"]
    for name, row in summary["per_slice"].items():
        expected = row["frames"] if name.rsplit("/", 1)[-1] in {"highway", "merge"} else 0
        assert row["judged"] == expected, name
