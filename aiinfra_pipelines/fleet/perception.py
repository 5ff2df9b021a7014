"""The perception interface: what the car's perception produces and the planner consumes.

:func:`perception_from_ground_truth` is also the auto-label definition: training targets for the
perception network are exactly this function applied to simulation ground truth. It therefore
stays a pure function of its arguments (no config reads, no randomness), so a label can be
recomputed from any stored log and always agrees with what the planner saw in simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from aiinfra_pipelines.logs.model import OtherVehicle

# Occupancy rows, in order. lane_offset follows OtherVehicle: +1 left, 0 ego, -1 right.
LANE_ROWS: tuple[str, ...] = ("left", "ego", "right")
ROW_OF_LANE_OFFSET: dict[int, int] = {1: 0, 0: 1, -1: 2}
LEFT_ROW, EGO_ROW, RIGHT_ROW = 0, 1, 2


@dataclass(frozen=True)
class Perception:
    """One frame's perceived scene.

    ``occupancy[row, b]`` is the probability that lane ``row`` (left, ego, right) holds a vehicle
    whose centre lies in distance bin ``b`` (edges from fleet.yaml ``perception.bin_edges_m``).
    ``lead_gap_m`` is the longitudinal centre distance to the nearest vehicle ahead in the ego
    lane, capped at the perception range. ``confidence`` (0..1) is how much the producer trusts
    this output; ground truth is 1.0, a network reports its own.
    """

    occupancy: np.ndarray
    lead_gap_m: float
    confidence: float

    def __post_init__(self) -> None:
        if self.occupancy.ndim != 2 or self.occupancy.shape[0] != len(LANE_ROWS):
            raise ValueError(f"occupancy must be 3 x bins, got shape {self.occupancy.shape}")
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence must be within 0..1, got {self.confidence}")


def perception_from_ground_truth(
    others: Sequence[OtherVehicle],
    lane_index: int,
    lane_count: int,
    bins: Sequence[float],
    max_range: float,
) -> Perception:
    """Ideal perception of ``others`` (ego-frame ground truth) for an ego in ``lane_index``.

    ``lane_index`` counts from the leftmost lane (0), as highway-env does; ``lane_count`` is the
    number of drivable lanes (0 when unknown). A lane that does not exist is reported fully
    occupied: the planner treats "no road" and "a car" alike, so it can never steer off the
    road. Vehicles beyond the outer bin edges or further than one lane away are not represented.
    """
    edges = np.asarray(bins, dtype=float)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bins must be increasing edges, got {list(bins)}")
    occupancy = np.zeros((len(LANE_ROWS), edges.size - 1), dtype=np.float32)
    lead_gap = float(max_range)
    for other in others:
        row = ROW_OF_LANE_OFFSET.get(other.lane_offset)
        if row is None:
            continue
        if edges[0] <= other.x < edges[-1]:
            occupancy[row, int(np.searchsorted(edges, other.x, side="right")) - 1] = 1.0
        if row == EGO_ROW and other.x > 0.0:
            lead_gap = min(lead_gap, float(other.x))
    occupancy = fill_missing_lanes(occupancy, lane_index, lane_count)
    return Perception(occupancy=occupancy, lead_gap_m=lead_gap, confidence=1.0)


def fill_missing_lanes(
    occupancy: np.ndarray, lane_index: ArrayLike, lane_count: ArrayLike
) -> np.ndarray:
    """``occupancy`` (``... x 3 x bins``) with the lanes the map says do not exist set to 1.

    Whether a lane exists beside ego is map knowledge (the car localizes itself in a lane of a
    known road), not something a camera can tell reliably: the oncoming lane of a two-lane
    junction road looks exactly like a free overtaking lane. So the car's perception output is
    the network's occupancy with the map's missing lanes filled in, by the same rule the labels
    use: no lane left of lane 0, none right of lane ``lane_count - 1``. ``lane_index`` and
    ``lane_count`` are scalars or arrays matching ``occupancy``'s leading dimensions.
    """
    filled = np.array(occupancy, dtype=np.float32, copy=True)
    if filled.ndim < 2 or filled.shape[-2] != len(LANE_ROWS):
        raise ValueError(f"occupancy must be ... x 3 x bins, got shape {filled.shape}")
    index = np.asarray(lane_index)
    count = np.asarray(lane_count)
    no_left = np.broadcast_to(index <= 0, filled.shape[:-2])
    no_right = np.broadcast_to(index >= count - 1, filled.shape[:-2])
    filled[..., LEFT_ROW, :][no_left] = 1.0
    filled[..., RIGHT_ROW, :][no_right] = 1.0
    return filled
