"""How ``aiinfra query`` shows a result: a JSON document for scripts, a table for people.

The scene index is some forty columns wide; a table of all of them is unreadable, so the table
shows the frame's identity and slice plus exactly the fields the expression tested — the
columns that explain why each row matched. ``--json`` carries every column.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .query import SceneQueryResult
from .query_parser import parse_query, referenced_fields

IDENTITY_COLUMNS = ("log_id", "frame_index", "t_rel_s", "slice")


def result_json(result: SceneQueryResult, ref: str) -> str:
    """The result as one JSON object: commit, ref, expression, sql, counts and every row."""
    rows = json.loads(result.rows.to_json(orient="records", date_format="iso"))
    return json.dumps(
        {
            "commit": result.commit,
            "ref": ref,
            "expression": result.expression,
            "sql": result.sql,
            "params": list(result.params),
            "count": len(rows),
            "matched": result.matched,
            "rows": rows,
        },
        indent=2,
        default=str,
    )


def _cell(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else escape(str(value))


def render_query_result(result: SceneQueryResult, ref: str, console: Console) -> None:
    """The matching frames as a table under a line naming the commit they came from."""
    console.print(
        f"{result.matched} frame(s) match at [cyan]{escape(ref)}[/] "
        f"(commit [green]{result.commit[:12]}[/])"
        + (f", showing {len(result.rows)}" if len(result.rows) < result.matched else "")
    )
    if result.rows.empty:
        return
    wanted = [*IDENTITY_COLUMNS, *referenced_fields(parse_query(result.expression))]
    columns = [c for c in dict.fromkeys(wanted) if c in result.rows.columns]
    table = Table(*columns)
    for row in result.rows[columns].itertuples(index=False):
        table.add_row(*(_cell(value) for value in row))
    console.print(table)
