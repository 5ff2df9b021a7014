"""Synthetic frame tables for dataset tests: exact log/slice layouts in milliseconds."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd


def make_frames(logs_per_slice: Mapping[str, int], frames_per_log: int = 3) -> pd.DataFrame:
    """A frame table with ``logs_per_slice[slice]`` logs per slice, condition columns filled."""
    rows = []
    for slice_, n_logs in logs_per_slice.items():
        lighting, weather, road_type = slice_.split("/")
        for i in range(n_logs):
            log_id = f"{slice_.replace('/', '-')}-log{i:02d}"
            for frame in range(frames_per_log):
                rows.append(
                    {
                        "log_id": log_id,
                        "frame_index": frame,
                        "slice": slice_,
                        "lighting": lighting,
                        "weather": weather,
                        "road_type": road_type,
                    }
                )
    return pd.DataFrame(rows)
