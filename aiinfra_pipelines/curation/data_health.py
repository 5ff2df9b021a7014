"""Data health of a set of published frames: perceptual hashes, features, and their findings.

The lake-facing half of the data-health checks (the maths is in ``perceptual_hash`` and
``label_errors``). Frames are read once per frames object and reduced on the spot to a 64-bit
hash and, when asked, a small thumbnail: a 100k-frame dataset never holds its pixels in memory
at once, and each object is read exactly once for every signal the checks need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.metadata_tables import markdown_table
from aiinfra_pipelines.perception.contract import LANES, decode_images

from .perceptual_hash import grey_thumbnails, near_pairs, phash

FRAME_KEY = ["log_id", "frame_index"]
KEY_COLUMNS = [*FRAME_KEY, "slice"]
LANE_NAMES = ("left", "ego", "right")
_PIXEL_COLUMNS = [*FRAME_KEY, "image", "image_height", "image_width"]


@dataclass(frozen=True)
class FrameSignals:
    """Per frame, aligned with ``keys`` (log_id, frame_index, slice): hash and thumbnail."""

    keys: pd.DataFrame
    hashes: np.ndarray  # uint64
    thumbnails: np.ndarray | None  # float32 N x (rows * columns), when asked for


def frame_signals(
    lake: VersionedLake,
    rows: pd.DataFrame,
    ref: str,
    thumbnail: tuple[int, int] | None = None,
) -> FrameSignals:
    """Hashes (and thumbnails) of ``rows``' front images (needs ``frames_object``), at ``ref``.

    Raises ``ValueError`` naming the object when a referenced frame is not there.
    """
    missing = [c for c in [*KEY_COLUMNS, "frames_object"] if c not in rows.columns]
    if missing:
        raise ValueError(f"frame rows lack column(s) {missing}")
    keys, hashes, thumbs = [], [], []
    for frames_object, wanted in rows.groupby("frames_object", sort=True):
        stored = lake.get_parquet(ref, str(frames_object), columns=_PIXEL_COLUMNS)
        found = wanted[KEY_COLUMNS].merge(stored, on=FRAME_KEY, how="left")
        if found["image"].isna().any():
            absent = found.loc[found["image"].isna(), "frame_index"].tolist()[:5]
            raise ValueError(f"{frames_object} at {ref[:12]} lacks frame(s) {absent}")
        images = _decode(found)
        keys.append(found[KEY_COLUMNS])
        hashes.append(phash(images))
        if thumbnail is not None:
            thumbs.append(grey_thumbnails(images, *thumbnail))
    if not keys:
        return FrameSignals(pd.DataFrame(columns=KEY_COLUMNS), np.empty(0, np.uint64), None)
    return FrameSignals(
        pd.concat(keys, ignore_index=True),
        np.concatenate(hashes),
        np.concatenate(thumbs) if thumbnail is not None else None,
    )


def _decode(frames: pd.DataFrame) -> np.ndarray:
    sizes = frames[["image_height", "image_width"]].drop_duplicates()
    if len(sizes) != 1:
        raise ValueError(f"frames of one object have different sizes: {sizes.values.tolist()}")
    height, width = (int(v) for v in sizes.iloc[0])
    return decode_images(list(frames["image"]), height, width)


def near_duplicates(signals: FrameSignals, max_distance: int, same_log: bool) -> pd.DataFrame:
    """Pairs of frames within ``max_distance`` bits, closest first (other logs only unless
    ``same_log``): columns ``<key>_a``, ``<key>_b``, ``distance``."""
    pairs = near_pairs(signals.hashes, max_distance)
    table = _pair_table(signals.keys, pairs.left, signals.keys, pairs.right, ("a", "b"))
    table["distance"] = pairs.distance
    if not same_log:
        table = table[table["log_id_a"] != table["log_id_b"]]
    return table.reset_index(drop=True)


def split_leaks(training: FrameSignals, benchmark: FrameSignals, max_distance: int) -> pd.DataFrame:
    """Training × benchmark frame pairs within ``max_distance`` bits, closest first."""
    pairs = near_pairs(training.hashes, max_distance, other=benchmark.hashes)
    table = _pair_table(
        training.keys, pairs.left, benchmark.keys, pairs.right, ("training", "benchmark")
    )
    table["distance"] = pairs.distance
    return table


def _pair_table(
    left: pd.DataFrame,
    left_rows: np.ndarray,
    right: pd.DataFrame,
    right_rows: np.ndarray,
    suffixes: Sequence[str],
) -> pd.DataFrame:
    a = left.iloc[left_rows].reset_index(drop=True).add_suffix(f"_{suffixes[0]}")
    b = right.iloc[right_rows].reset_index(drop=True).add_suffix(f"_{suffixes[1]}")
    return pd.concat([a, b], axis=1)


def frames_in_pairs(pairs: pd.DataFrame, suffixes: Sequence[str] = ("a", "b")) -> int:
    """Distinct frames that appear in ``pairs`` on either side."""
    sides = [
        pairs[[f"log_id_{s}", f"frame_index_{s}"]].set_axis(FRAME_KEY, axis=1) for s in suffixes
    ]
    return len(pd.concat(sides).drop_duplicates())


def cell_names(bin_edges_m: Sequence[float]) -> list[str]:
    """Occupancy cell names in the labels' flattened order (lane-major): ``ego 10..20 m``."""
    edges = [f"{edge:g}" for edge in bin_edges_m]
    return [
        f"{lane} {edges[b]}..{edges[b + 1]} m"
        for lane in LANE_NAMES[:LANES]
        for b in range(len(edges) - 1)
    ]


def occupancy_matrix(labels: pd.DataFrame, keys: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(flattened binary occupancy of ``keys``' frames, mask of the frames that have a label)."""
    joined = keys[FRAME_KEY].merge(
        labels.drop_duplicates(FRAME_KEY, keep="last")[[*FRAME_KEY, "occupancy"]],
        on=FRAME_KEY,
        how="left",
    )
    present = joined["occupancy"].notna().to_numpy()
    if not present.any():
        return np.zeros((0, 0)), present
    cells = np.asarray(joined.loc[present, "occupancy"].tolist(), dtype=np.float64)
    return (cells >= 0.5).astype(np.float64), present


def markdown(table: pd.DataFrame, max_rows: int) -> str:
    """The first ``max_rows`` rows as a markdown table for the UI (``none`` when empty)."""
    if table.empty:
        return "none"
    shown = markdown_table(table.head(max_rows))
    more = len(table) - max_rows
    return shown + (f"\n\n… and {more} more" if more > 0 else "")
