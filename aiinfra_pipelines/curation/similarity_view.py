"""How ``aiinfra similar`` shows a result: JSON records for scripts, a table for people."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .similarity_query import SimilarFrames


def similar_json(result: SimilarFrames) -> str:
    """A JSON list: one object per neighbour (``frame``, ``distance``, ``slice``, ``events``,
    ``log_id``, ``frame_index``, ``index_commit``, …), nearest first."""
    return json.dumps(result.records(), indent=2)


def render_similar(result: SimilarFrames, ref: str, console: Console) -> None:
    """The neighbours as a table under a line naming the index's commit and engine."""
    console.print(
        f"{len(result.rows)} frame(s) nearest [cyan]{escape(result.query)}[/] at "
        f"[cyan]{escape(ref)}[/] (index of commit [green]{result.index_commit[:12]}[/], "
        f"engine {result.engine_sha[:12]}, {result.metric} distance, "
        f"{result.indexed_frames} frames indexed)"
    )
    table = Table("rank", "frame", "distance", "slice", "events")
    for row in result.rows.itertuples(index=False):
        table.add_row(
            str(row.rank),
            escape(row.frame),
            f"{row.distance:.4f}",
            escape(str(row.slice)),
            escape(", ".join(row.events)),
        )
    console.print(table)
