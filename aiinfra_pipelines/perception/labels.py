"""Auto-labels from simulation ground truth: the targets the network learns.

The teacher is the same pure function the fleet's planner uses on ground truth
(``fleet.perception.perception_from_ground_truth``), applied to the vehicles the front camera
can see: a camera model is not asked to report a car it was never shown. On straight roads
every vehicle in the three lanes is in view and nothing changes; in a roundabout, the ring
"ahead" of ego curves out of the image, and a car on the far side of the ring (same ring, so
"in ego's lane") used to be labelled as the lead although no pixel of it was in the frame
(docs/training.md). The oracle planner in simulation still sees everything: it is the ceiling.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from aiinfra_pipelines.fleet.camera import EgoCamera
from aiinfra_pipelines.fleet.perception import perception_from_ground_truth
from aiinfra_pipelines.logs.model import OtherVehicle

from .contract import PerceptionSpec


def _others(ground_truth_json: str, camera: EgoCamera) -> list[OtherVehicle]:
    """The logged vehicles whose centre the front camera sees."""
    return [
        OtherVehicle(
            vehicle_id=int(item["vehicle_id"]),
            x=float(item["x"]),
            y=float(item["y"]),
            vx=float(item["vx"]),
            vy=float(item["vy"]),
            lane_offset=int(item["lane_offset"]),
        )
        for item in json.loads(ground_truth_json)
        if camera.sees(float(item["x"]), float(item["y"]))
    ]


def ground_truth_labels(
    frames: pd.DataFrame, spec: PerceptionSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(occupancy N x 3 x bins in {0,1}, lead gap N normalized to [0,1]) for each frame row."""
    camera = EgoCamera.load()
    occupancy = np.zeros((len(frames), 3, spec.bins), dtype=np.float32)
    lead_gap = np.zeros(len(frames), dtype=np.float32)
    rows = zip(frames["ground_truth"], frames["lane_index"], frames["lane_count"], strict=True)
    for i, (ground_truth, lane_index, lane_count) in enumerate(rows):
        perception = perception_from_ground_truth(
            _others(ground_truth, camera),
            int(lane_index),
            int(lane_count),
            spec.bin_edges_m,
            spec.max_range_m,
        )
        occupancy[i] = perception.occupancy
        lead_gap[i] = min(perception.lead_gap_m, spec.max_range_m) / spec.max_range_m
    return occupancy, lead_gap
