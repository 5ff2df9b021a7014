"""One dynamic partition per drive-log object landed on an ingest branch.

The partition key is ``<ingest branch>/<object key>`` so every asset of a partition (and an
operator re-materializing it from the UI) can find the raw object without any side table.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, LOG_PREFIX, LOG_SUFFIX

drive_log_partitions = dg.DynamicPartitionsDefinition(name="drive_logs")


@dataclass(frozen=True)
class LogLocation:
    """Where one raw drive log lives: its ingest branch and object key."""

    branch: str
    key: str

    @property
    def partition_key(self) -> str:
        return f"{self.branch}/{self.key}"

    @property
    def log_name(self) -> str:
        """The file name without folder or extension (the fleet's log id)."""
        return self.key.rsplit("/", 1)[-1].removesuffix(LOG_SUFFIX)

    @classmethod
    def from_partition_key(cls, partition_key: str) -> LogLocation:
        branch, sep, key = partition_key.partition("/")
        if not sep or not branch.startswith(INGEST_BRANCH_PREFIX) or not key.endswith(LOG_SUFFIX):
            raise ValueError(
                f"drive-log partition key {partition_key!r} is not "
                f"'{INGEST_BRANCH_PREFIX}<batch>/<key>{LOG_SUFFIX}'"
            )
        return cls(branch=branch, key=key)


def is_drive_log_key(key: str) -> bool:
    return key.startswith(LOG_PREFIX) and key.endswith(LOG_SUFFIX)
