""" "More like this" requests: a frame's neighbours recorded in the lake, and what grows from them.

An operator names a frame on the launchpad (the ``more_like_this`` asset); its nearest frames
are stored as one Parquet table per request and ``latest.json`` points at the newest, so the
fleet scenario library (simulation, a later layer) can add those frames' logs as scenario
candidates: drive more of what the operator found interesting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.lake.io_manager import parquet_bytes
from aiinfra_pipelines.lake.layout import (
    LATEST_MORE_LIKE_THIS_KEY,
    MAIN_BRANCH,
    more_like_this_result_key,
)
from aiinfra_pipelines.lake.port import VersionedLake

from .similarity_query import SimilarFrames

CANDIDATE_COLUMNS: tuple[str, ...] = ("log_id", "frame", "distance", "query", "request_id")


@dataclass(frozen=True)
class MoreLikeThis:
    """One request's result as it is written to the lake."""

    request_id: str
    result: SimilarFrames
    k: int

    def pointer(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "frame": self.result.query,
            "k": self.k,
            "result_key": more_like_this_result_key(self.request_id),
            "index_commit": self.result.index_commit,
            "engine_sha": self.result.engine_sha,
            "metric": self.result.metric,
            "frames": len(self.result.rows),
            "logs": list(dict.fromkeys(self.result.rows["log_id"].astype(str))),
        }

    def objects(self) -> dict[str, bytes]:
        """The result table and the ``latest.json`` pointer (publish them together)."""
        table = self.result.rows.assign(
            query=self.result.query,
            request_id=self.request_id,
            index_commit=self.result.index_commit,
        )
        return {
            more_like_this_result_key(self.request_id): parquet_bytes(table),
            LATEST_MORE_LIKE_THIS_KEY: json.dumps(self.pointer(), indent=1).encode(),
        }


def latest_more_like_this(lake: VersionedLake, ref: str = MAIN_BRANCH) -> pd.DataFrame:
    """The newest request's result rows at ``ref`` (empty when none was ever made)."""
    pointer = lake.get_json_or_none(ref, LATEST_MORE_LIKE_THIS_KEY)
    if pointer is None:
        return pd.DataFrame(columns=["rank", "frame", "log_id", "distance", "query", "request_id"])
    return lake.get_parquet(ref, pointer["result_key"])


def scenario_candidate_logs(result: pd.DataFrame, max_logs: int) -> pd.DataFrame:
    """The first ``max_logs`` distinct logs of a result, nearest first, each with the frame that
    brought it (its nearest one): the logs a scenario library adds as candidates."""
    if result.empty or max_logs == 0:
        return pd.DataFrame(columns=list(CANDIDATE_COLUMNS))
    ordered = result.sort_values(["distance", "rank"], kind="stable")
    nearest = ordered.drop_duplicates("log_id", keep="first").head(max_logs)
    return nearest.assign(log_id=nearest["log_id"].astype(str))[list(CANDIDATE_COLUMNS)]
