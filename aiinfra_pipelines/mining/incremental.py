"""Keep mining cost proportional to new frames: re-running with no new data does no inference.

Two mechanisms, at two grains, both keyed by the engine's SHA-256 so that deploying a new
engine re-mines everything (its predictions, hence its badcases, differ):

* a frame **ledger** — ``(log_id, frame_index, engine_sha)`` rows of every frame already run
  through an engine, badcase or not. :func:`frames_to_mine` subtracts it from the indexed
  frames. The ledger, not the badcase table, is the record: a frame that produced no badcase
  was still mined and must not be re-run.
* a **result cache** keyed by ``(engine_sha, log_id)`` holding that log's badcase rows (possibly
  none) and a fingerprint of the frames it was mined on, so a log that gained or lost frames is
  re-mined. :func:`mine_incrementally` runs the engine only on logs missing from the cache;
  counting ``engine.infer`` calls in a test proves an unchanged re-run does no inference.

Logs are the natural cache grain: they land whole (one triggered segment = one log) and the
temporal-instability rule needs a log's consecutive frames together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from aiinfra_pipelines.perception.contract import PerceptionSpec
from aiinfra_pipelines.perception.engine import Engine
from aiinfra_pipelines.perception.labels import ground_truth_labels

from .engine_runner import perceive_frames
from .rules import BADCASE_COLUMNS, KEYS, mine_badcases

LEDGER_COLUMNS: tuple[str, str, str] = ("log_id", "frame_index", "engine_sha")
Labeller = Callable[[pd.DataFrame, PerceptionSpec], tuple[np.ndarray, np.ndarray]]


def mined_ledger(frames: pd.DataFrame, engine_sha: str) -> pd.DataFrame:
    """Ledger rows recording that ``frames`` were mined with ``engine_sha`` (append these)."""
    ledger = frames[list(KEYS)].drop_duplicates().reset_index(drop=True)
    ledger["engine_sha"] = engine_sha
    return ledger[list(LEDGER_COLUMNS)]


def frames_to_mine(
    frames: pd.DataFrame, already_mined: pd.DataFrame | None, engine_sha: str
) -> pd.DataFrame:
    """Rows of ``frames`` whose ``(log_id, frame_index)`` was not yet mined with ``engine_sha``.

    ``already_mined`` is the ledger (:data:`LEDGER_COLUMNS`; extra columns ignored) or None.
    Entries for other engine SHAs do not count: a new engine re-mines every frame.
    """
    if already_mined is None or already_mined.empty:
        return frames.reset_index(drop=True)
    done = already_mined.loc[already_mined["engine_sha"] == engine_sha, list(KEYS)]
    if done.empty:
        return frames.reset_index(drop=True)
    done_keys = pd.MultiIndex.from_frame(done.drop_duplicates())
    keys = pd.MultiIndex.from_frame(frames[list(KEYS)])
    return frames[~keys.isin(done_keys)].reset_index(drop=True)


def log_fingerprint(frame_indices: Any) -> str:
    """Order-independent identity of the frames a log was mined on."""
    ordered = np.sort(np.asarray(frame_indices, dtype=np.int64))
    return hashlib.sha256(ordered.tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class CachedLog:
    fingerprint: str
    badcases: pd.DataFrame


@dataclass
class MiningResultCache:
    """Badcase rows per ``(engine_sha, log_id)``; persisted as two tables (see to_tables)."""

    entries: dict[tuple[str, str], CachedLog] = field(default_factory=dict)

    def get(
        self, engine_sha: str, log_id: str, fingerprint: str | None = None
    ) -> pd.DataFrame | None:
        """The cached badcases, or None when absent or mined on a different set of frames."""
        entry = self.entries.get((engine_sha, str(log_id)))
        if entry is None or (fingerprint is not None and entry.fingerprint != fingerprint):
            return None
        return entry.badcases

    def put(self, engine_sha: str, log_id: str, fingerprint: str, badcases: pd.DataFrame) -> None:
        self.entries[(engine_sha, str(log_id))] = CachedLog(
            fingerprint, badcases.reset_index(drop=True)
        )

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.entries)

    def to_tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(logs: engine_sha, log_id, fingerprint; badcases with engine_sha) for the lake.

        Two tables because a log with no badcases is still a cache entry: its absence from the
        badcase table must not read as "not mined".
        """
        logs = pd.DataFrame(
            [(sha, log, entry.fingerprint) for (sha, log), entry in self.entries.items()],
            columns=["engine_sha", "log_id", "fingerprint"],
        )
        parts = [
            entry.badcases.assign(engine_sha=sha)
            for (sha, _), entry in self.entries.items()
            if not entry.badcases.empty
        ]
        badcases = (
            pd.concat(parts, ignore_index=True)
            if parts
            else pd.DataFrame(columns=[*BADCASE_COLUMNS, "engine_sha"])
        )
        return logs, badcases

    @classmethod
    def from_tables(cls, logs: pd.DataFrame, badcases: pd.DataFrame) -> MiningResultCache:
        """Rebuild a cache from :meth:`to_tables` output (e.g. the previous materialization)."""
        cache = cls()
        groups = (
            {key: group for key, group in badcases.groupby(["engine_sha", "log_id"], sort=False)}
            if not badcases.empty
            else {}
        )
        empty = pd.DataFrame(columns=list(BADCASE_COLUMNS))
        for sha, log_id, fingerprint in logs[["engine_sha", "log_id", "fingerprint"]].itertuples(
            index=False
        ):
            group = groups.get((sha, log_id))
            rows = empty if group is None else group.drop(columns=["engine_sha"])
            cache.put(str(sha), str(log_id), str(fingerprint), rows)
        return cache


@dataclass(frozen=True)
class IncrementalMiningResult:
    badcases: pd.DataFrame  # every log of the input frames, cached or freshly mined
    mined_logs: list[str]  # logs that went through the engine this call
    cached_logs: list[str]  # logs answered from the cache
    frames_inferred: int


def mine_incrementally(
    engine: Engine,
    frames: pd.DataFrame,
    index: pd.DataFrame | None,
    spec: PerceptionSpec,
    cache: MiningResultCache,
    config: dict[str, Any] | None = None,
    *,
    labeller: Labeller = ground_truth_labels,
) -> IncrementalMiningResult:
    """Badcases for all logs in ``frames``; the engine runs only on logs the cache lacks.

    New results are written into ``cache`` (mutated in place). Labels are computed for the
    mined logs only, with ``labeller`` (the teacher by default).
    """
    sha = engine.sha256
    results: list[pd.DataFrame] = []
    stale: list[str] = []
    cached: list[str] = []
    fingerprints: dict[str, str] = {}
    for log_id, group in frames.groupby("log_id", sort=True):
        fingerprint = log_fingerprint(group["frame_index"].to_numpy())
        hit = cache.get(sha, str(log_id), fingerprint)
        if hit is None:
            stale.append(str(log_id))
            fingerprints[str(log_id)] = fingerprint
        else:
            cached.append(str(log_id))
            results.append(hit)
    todo = frames[frames["log_id"].astype(str).isin(stale)].reset_index(drop=True)
    if len(todo):
        predictions = perceive_frames(engine, todo, spec, config=config)
        mined = mine_badcases(todo, index, predictions, labeller(todo, spec), config, spec=spec)
        by_log = dict(tuple(mined.groupby(mined["log_id"].astype(str), sort=False)))
        for log_id in stale:
            rows = by_log.get(log_id, mined.iloc[0:0])
            cache.put(sha, log_id, fingerprints[log_id], rows)
            results.append(rows)
    non_empty = [r for r in results if not r.empty]
    badcases = (
        pd.concat(non_empty, ignore_index=True)
        if non_empty
        else pd.DataFrame(columns=list(BADCASE_COLUMNS))
    )
    if not badcases.empty:
        badcases = badcases.sort_values(["log_id", "timestamp_ns"], kind="stable").reset_index(
            drop=True
        )
    return IncrementalMiningResult(
        badcases=badcases, mined_logs=stale, cached_logs=cached, frames_inferred=len(todo)
    )
