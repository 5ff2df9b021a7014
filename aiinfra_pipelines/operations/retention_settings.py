"""Typed access to ``resources/operations.yaml`` ``retention``: how old raw data may get, what
may expire, and which dependents keep it.

A certified engine's lineage is kept whatever this file says: ``protect`` always includes
``certificate`` (a configuration that leaves it out is read as if it listed it), because an
engine running in cars must stay traceable to the raw logs it was trained from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

CONFIG_FILE = "operations.yaml"

INGEST_BRANCH = "ingest_branch"
QUARANTINED_UPLOAD = "quarantined_upload"
EXPIRABLE_KINDS = (INGEST_BRANCH, QUARANTINED_UPLOAD)

DATASET = "dataset"
BENCHMARK = "benchmark"
SCENARIO = "scenario"
CERTIFICATE = "certificate"
DEPENDENT_KINDS = (DATASET, BENCHMARK, SCENARIO, CERTIFICATE)
ALWAYS_PROTECTED = frozenset({CERTIFICATE})


@dataclass(frozen=True)
class RetentionSettings:
    """What the retention plan expires and what keeps data alive."""

    max_age_days: float
    expire: frozenset[str]
    protect: frozenset[str]
    metadata_rows: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> RetentionSettings:
        section = settings_section(CONFIG_FILE, "retention", config)
        expire = frozenset(str(kind) for kind in section.list("expire"))
        protect = frozenset(str(kind) for kind in section.list("protect"))
        if unknown := expire - set(EXPIRABLE_KINDS):
            raise section.error(
                "expire", f"unknown kinds {sorted(unknown)}; known: {EXPIRABLE_KINDS}"
            )
        if unknown := protect - set(DEPENDENT_KINDS):
            raise section.error(
                "protect", f"unknown kinds {sorted(unknown)}; known: {DEPENDENT_KINDS}"
            )
        settings = cls(
            max_age_days=section.float("max_age_days"),
            expire=expire,
            protect=protect | ALWAYS_PROTECTED,
            metadata_rows=section.int("metadata_rows"),
        )
        if settings.max_age_days < 0:
            raise section.error("max_age_days", f"must be >= 0, got {settings.max_age_days}")
        if settings.metadata_rows < 1:
            raise section.error("metadata_rows", f"must be >= 1, got {settings.metadata_rows}")
        return settings
