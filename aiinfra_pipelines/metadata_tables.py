"""Rows as a typed Dagster table: the one shape every asset's UI table takes.

Shared by every layer (like ``progress``), so each asset's metadata says which rows it shows,
not how a ``TableMetadataValue`` is assembled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

_SCALARS = (str, int, float, bool)


def column_type(values: Sequence[Any]) -> str:
    """Dagster's column type for a column's non-null values: bool, int, float or string."""
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "float"
    return "string"


def table_metadata(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None
) -> dg.TableMetadataValue:
    """``rows`` as a Dagster table, each column typed from its non-null values.

    ``columns`` fixes the columns and their order (an empty table still shows them); by
    default they are the first row's keys. A value that is not a scalar is shown empty.
    """
    names = list(columns) if columns is not None else list(rows[0]) if rows else []
    schema = [
        dg.TableColumn(name, column_type([row[name] for row in rows if row.get(name) is not None]))
        for name in names
    ]
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    name: (row.get(name) if isinstance(row.get(name), _SCALARS) else None)
                    for name in names
                }
            )
            for row in rows
        ],
        schema=dg.TableSchema(columns=schema),
    )


# Characters that change what Markdown shows inside a table cell. "_" is left alone: within a
# word (metric names) CommonMark never reads it as emphasis, and escaping it would garble them.
_MARKDOWN_SPECIALS = str.maketrans({c: f"\\{c}" for c in "\\`*[]|<>"})


def escape_markdown(text: str) -> str:
    """``text`` shown literally in Markdown: a slice named ``day/*/*`` is not emphasis."""
    return text.translate(_MARKDOWN_SPECIALS)


def markdown_table(table: Any, *, index: bool = False) -> str:
    """A DataFrame as a Markdown table whose text cells and headers show literally (slice names
    and glob patterns keep their ``*``); numbers are left as they are."""
    shown = table.copy()
    shown.columns = [escape_markdown(str(c)) for c in shown.columns]
    for column in shown.columns:
        if shown[column].dtype == object:
            shown[column] = [escape_markdown(v) if isinstance(v, str) else v for v in shown[column]]
    if index:
        shown.index = [escape_markdown(str(i)) for i in shown.index]
    return shown.to_markdown(index=index)
