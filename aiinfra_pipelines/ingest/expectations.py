"""Great Expectations suites from ``resources/expectations/`` run against a DataFrame.

Suites are plain GX 1.x JSON (``name`` + ``expectations`` of ``type``/``kwargs``), so data
owners edit them without touching code. GX is imported lazily: it costs seconds to import and
only the asset checks need it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from aiinfra_pipelines.config import resources_dir


@dataclass(frozen=True)
class ExpectationOutcome:
    expectation: str
    column: str
    success: bool
    unexpected_count: int | None
    detail: str


def load_suite_definition(name: str) -> dict[str, Any]:
    path = resources_dir() / "expectations" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"expectation suite not found: {path}")
    return json.loads(path.read_text())


def suite_names(prefix: str) -> list[str]:
    """The suites in ``resources/expectations/`` for one asset (``<prefix>*.json``)."""
    folder = resources_dir() / "expectations"
    return sorted(path.stem for path in folder.glob(f"{prefix}*.json"))


def run_suite(df: pd.DataFrame, suite_name: str) -> list[ExpectationOutcome]:
    """Validate ``df`` against the named suite; one outcome per expectation."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    definition = load_suite_definition(suite_name)
    suite = gx.ExpectationSuite(
        name=definition["name"],
        expectations=[
            ExpectationConfiguration(type=e["type"], kwargs=e.get("kwargs", {})).to_domain_obj()
            for e in definition["expectations"]
        ],
    )
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas("aiinfra")
        .add_dataframe_asset(suite_name)
        .add_batch_definition_whole_dataframe("whole")
        .get_batch(batch_parameters={"dataframe": df})
    )
    result = batch.validate(suite)
    outcomes = []
    for item in result.results:
        config = item.expectation_config
        details = item.result or {}
        exception = (item.exception_info or {}).get("exception_message")
        outcomes.append(
            ExpectationOutcome(
                expectation=config.type,
                column=str(config.kwargs.get("column", config.kwargs.get("column_list", ""))),
                success=bool(item.success),
                unexpected_count=details.get("unexpected_count"),
                detail=str(
                    exception
                    or details.get("partial_unexpected_list")
                    or details.get("observed_value", "")
                )[:200],
            )
        )
    return outcomes
