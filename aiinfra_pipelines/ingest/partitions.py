"""One dynamic partition per landed upload batch: a commit on an ``ingest-<batch>`` branch.

Partitions grow with batches, never with logs: a fleet lands tens of thousands of logs a day,
and Dagster partitions are meant to number in the thousands. The partition key is
``<ingest branch>/<commit id>``, so every asset of a partition (and an operator re-materializing
it from the UI) finds the batch's logs from the key alone: the drive logs that commit added or
changed. A branch that grows by a later commit is a new batch holding only the new logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from aiinfra_pipelines.lake.layout import (
    INGEST_BRANCH_PREFIX,
    LOG_PREFIX,
    LOG_SUFFIX,
    UPLOAD_SUFFIXES,
)

ingest_batch_partitions = dg.DynamicPartitionsDefinition(name="ingest_batches")


@dataclass(frozen=True)
class BatchRef:
    """One landed batch: the ingest branch and the commit that landed it."""

    branch: str
    commit: str

    @property
    def partition_key(self) -> str:
        return f"{self.branch}/{self.commit}"

    @classmethod
    def from_partition_key(cls, partition_key: str) -> BatchRef:
        branch, sep, commit = partition_key.partition("/")
        if not sep or not branch.startswith(INGEST_BRANCH_PREFIX) or not commit or "/" in commit:
            raise ValueError(
                f"ingest batch partition key {partition_key!r} is not "
                f"'{INGEST_BRANCH_PREFIX}<batch>/<commit id>'"
            )
        return cls(branch=branch, commit=commit)


@dataclass(frozen=True)
class LogLocation:
    """Where one raw drive log lives: its ingest branch and object key."""

    branch: str
    key: str

    @property
    def name(self) -> str:
        """``<branch>/<key>``: how quarantine records and reports name a log."""
        return f"{self.branch}/{self.key}"

    @property
    def log_name(self) -> str:
        """The file name without folder or extension (the fleet's log id)."""
        return self.key.rsplit("/", 1)[-1].removesuffix(LOG_SUFFIX)

    @property
    def stem(self) -> str:
        """The key without ``logs/`` and ``.mcap``: unique within a batch, safe as a lake key."""
        return self.key.removeprefix(LOG_PREFIX).removesuffix(LOG_SUFFIX)


def is_drive_log_key(key: str) -> bool:
    """A car's upload under ``logs/``: an MCAP log, an index record or a pull notice."""
    return key.startswith(LOG_PREFIX) and key.endswith(UPLOAD_SUFFIXES)
