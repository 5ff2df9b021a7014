"""What an operator wants to see at a glance: the lake's branches, what is in production and
how each rollout stands, published data, quarantine."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aiinfra_pipelines.ingest.pulls import pull_request_counts
from aiinfra_pipelines.ingest.views import quarantine_view, raw_available, scene_index_view
from aiinfra_pipelines.lake.layout import INGEST_BRANCH_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import RUN_BRANCH_PREFIX
from aiinfra_pipelines.release.release_state import production_line, rollout_rows
from aiinfra_pipelines.release.rollout_store import list_states


def frames_by_slice(index: pd.DataFrame) -> pd.DataFrame:
    """Frame and log counts per lighting × weather × road-type slice."""
    if index.empty:
        return pd.DataFrame(columns=["slice", "logs", "frames"])
    grouped = index.groupby("slice").agg(logs=("log_id", "nunique"), frames=("frame_index", "size"))
    return grouped.reset_index().sort_values("slice")


def held_on_cars_line(lake: VersionedLake) -> str:
    """Segments indexed from index records (raw still on the cars) and the pulls for them."""
    every = scene_index_view(lake, include_index_only=True)
    held = every[~raw_available(every)] if not every.empty else pd.DataFrame(columns=["log_id"])
    pulls = pull_request_counts(lake)
    by_status = ", ".join(f"{count} {status}" for status, count in sorted(pulls.items()))
    return (
        f"held on cars (index only): {held['log_id'].nunique()} segment(s), {len(held)} "
        f"frame(s); pull requests: {by_status or 'none'}"
    )


def render_release(lake: VersionedLake, console: Console) -> None:
    console.print(production_line(lake))
    rows = rollout_rows(list_states(lake))
    if not rows:
        console.print("rollouts: none")
        return
    table = Table(*rows[0], title="rollouts (newest last)")
    for row in rows:
        style = "bold red" if row["status"] == "ROLLED BACK" else None
        table.add_row(*(escape(value) for value in row.values()), style=style)
    console.print(table)


def render_status(lake: VersionedLake, console: Console) -> None:
    branches = lake.list_branches()
    ingest = [b for b in branches if b.name.startswith(INGEST_BRANCH_PREFIX)]
    runs = [b for b in branches if b.name.startswith(RUN_BRANCH_PREFIX)]
    main_commits = lake.log(MAIN_BRANCH)
    console.print(
        f"[bold]lake[/] {lake.repository}: main at {main_commits[0].id[:12]} "
        f"({len(main_commits)} commits), {len(ingest)} ingest branch(es), "
        f"{len(runs)} unpublished run branch(es)"
    )
    render_release(lake, console)
    index = scene_index_view(lake)
    table = Table("slice", "logs", "frames", title="published scene index")
    for row in frames_by_slice(index).itertuples():
        table.add_row(escape(row.slice), str(row.logs), str(row.frames))
    console.print(table)
    console.print(held_on_cars_line(lake))
    quarantine = quarantine_view(lake)
    if quarantine.empty:
        console.print("quarantine: empty")
        return
    qtable = Table("log", "reasons", title=f"quarantine ({len(quarantine)})")
    for row in quarantine.itertuples():
        qtable.add_row(row.log, row.reason_codes)
    console.print(qtable)
