"""``resources/similarity.yaml``: the frame index's metric and the query bounds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

CONFIG_FILE = "similarity.yaml"
METRICS: tuple[str, ...] = ("cosine",)


@dataclass(frozen=True)
class SimilaritySettings:
    metric: str
    default_k: int
    max_k: int
    scenario_max_logs: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> SimilaritySettings:
        index = settings_section(CONFIG_FILE, "index", config)
        query = settings_section(CONFIG_FILE, "query", config)
        scenarios = settings_section(CONFIG_FILE, "scenario_candidates", config)
        settings = cls(
            metric=index.str("metric"),
            default_k=query.int("default_k"),
            max_k=query.int("max_k"),
            scenario_max_logs=scenarios.int("max_logs"),
        )
        if settings.metric not in METRICS:
            raise index.error("metric", f"must be one of {list(METRICS)}, got {settings.metric!r}")
        if not 1 <= settings.default_k <= settings.max_k:
            raise query.error("default_k", f"must be in [1, max_k={settings.max_k}]")
        if settings.scenario_max_logs < 0:
            raise scenarios.error("max_logs", "must be at least 0")
        return settings
