"""Rows as typed Dagster tables: the shared shape of every asset's UI table."""

from __future__ import annotations

import pandas as pd

from aiinfra_pipelines.metadata_tables import (
    column_type,
    escape_markdown,
    markdown_table,
    table_metadata,
)


def test_columns_are_typed_from_their_non_null_values() -> None:
    rows = [
        {"name": "a", "count": 3, "share": 0.5, "ok": True, "extra": [1]},
        {"name": "b", "count": None, "share": 1, "ok": False, "extra": None},
    ]
    table = table_metadata(rows)
    types = {column.name: column.type for column in table.schema.columns}
    assert types == {
        "name": "string",
        "count": "int",
        "share": "float",
        "ok": "bool",
        "extra": "string",
    }
    # A value that is not a scalar is shown empty rather than breaking the table.
    assert [record.data["extra"] for record in table.records] == [None, None]
    assert column_type([True, 1]) == "string"  # a flag is not a number


def test_fixed_columns_keep_their_order_even_for_an_empty_table() -> None:
    table = table_metadata([], columns=("rank", "frame"))
    assert [column.name for column in table.schema.columns] == ["rank", "frame"]
    assert table.records == []
    picked = table_metadata([{"b": 1, "a": "x", "c": 2.0}], columns=("a", "b"))
    assert [column.name for column in picked.schema.columns] == ["a", "b"]
    assert picked.records[0].data == {"a": "x", "b": 1}


def test_markdown_tables_show_slice_names_and_patterns_literally() -> None:
    table = pd.DataFrame(
        {
            "slice": ["day/*/*", "night/rain/highway"],
            "metric": ["at_fault_rate", "a|b"],
            "n": [3, 4],
        }
    )
    shown = markdown_table(table)
    assert "day/\\*/\\*" in shown  # not emphasis ("day//" in the UI before)
    assert "a\\|b" in shown  # not a column break
    assert "at_fault_rate" in shown and "night/rain/highway" in shown
    assert escape_markdown("`x` <b>") == "\\`x\\` \\<b\\>"
