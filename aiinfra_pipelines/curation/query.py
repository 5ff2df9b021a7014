"""Scene queries over the scene index at any lake ref, run by duckdb.

The scene index is one Parquet object per ingested log partition; duckdb reads them together
(``union_by_name``: partitions indexed before a trigger rule existed simply lack its column)
and the compiled expression filters them. The ref is resolved to a commit *first* and every
object read at that commit, so a result is a reproducible snapshot — the commit it reports is
the one a dataset slice or a trigger proposal can name — even while ingest keeps merging.

``query_frame`` runs the same language over a DataFrame already in memory, so code that holds
a table (a dataset's frames, a mining result) slices it exactly as the CLI would.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from aiinfra_pipelines.lake.io_manager import DATA_PREFIX
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake

from .query_compiler import CompiledQuery, compile_query, quote_identifier
from .query_parser import QueryError, parse_query

__all__ = ["QueryError", "SceneQueryResult", "query_frame", "query_scene_index"]

SCENE_INDEX_PREFIX = f"{DATA_PREFIX}/scene_index/"
_TABLE = "scene_index"
# Frames come back in a stable order whatever order duckdb's threads read the files in.
_ORDER_COLUMNS = ("log_id", "frame_index")


@dataclass(frozen=True)
class SceneQueryResult:
    """The matching rows and what they were matched against."""

    rows: pd.DataFrame
    commit: str  # "" when the query ran on an in-memory frame
    expression: str
    sql: str
    params: tuple[object, ...]
    matched: int  # rows matching before ``limit``


def _columns(connection: duckdb.DuckDBPyConnection) -> dict[str, str]:
    described = connection.execute(f"DESCRIBE {_TABLE}").fetchall()
    return {str(row[0]): str(row[1]) for row in described}


def _visibility(columns: dict[str, str], include_index_only: bool) -> str:
    """The scene_index_view rule as SQL: index-only rows (raw log still on the car) are left out
    unless asked for, and even then give way to the raw rows of the same log once pulled."""
    if "raw_available" not in columns:
        return "TRUE"
    raw = 'COALESCE("raw_available", TRUE)'
    if not include_index_only or "log_id" not in columns:
        return raw
    return f'({raw} OR "log_id" NOT IN (SELECT "log_id" FROM {_TABLE} WHERE {raw}))'


def _run(
    connection: duckdb.DuckDBPyConnection,
    expression: str,
    limit: int | None,
    include_index_only: bool,
) -> tuple[pd.DataFrame, CompiledQuery, str, int]:
    columns = _columns(connection)
    compiled = compile_query(expression, columns)
    where = f"{_visibility(columns, include_index_only)} AND ({compiled.where})"
    order = ", ".join(quote_identifier(c) for c in _ORDER_COLUMNS if c in columns)
    sql = f"SELECT * FROM {_TABLE} WHERE {where}" + (f" ORDER BY {order}" if order else "")
    params = list(compiled.params)
    matched = connection.execute(f"SELECT count(*) FROM {_TABLE} WHERE {where}", params).fetchone()
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = connection.execute(sql, params).df()
    return rows, compiled, sql, int(matched[0]) if matched else 0


def query_frame(
    frame: pd.DataFrame,
    expression: str,
    *,
    limit: int | None = None,
    include_index_only: bool = False,
) -> SceneQueryResult:
    """The rows of ``frame`` that ``expression`` selects (fields checked against its columns)."""
    with duckdb.connect() as connection:
        connection.register("scene_frame", frame)
        connection.execute(f"CREATE TABLE {_TABLE} AS SELECT * FROM scene_frame")
        rows, compiled, sql, matched = _run(connection, expression, limit, include_index_only)
    return SceneQueryResult(rows, "", expression, sql, tuple(compiled.params), matched)


def _load_objects(
    connection: duckdb.DuckDBPyConnection, lake: VersionedLake, commit: str, workdir: Path
) -> bool:
    """Copy the scene index objects at ``commit`` into a duckdb table; False if there are none.

    Through local files because the lake port hands out bytes, not paths (a lakeFS object may
    live behind the S3 gateway); the table is materialized so the files can go at once.
    """
    keys = [
        stat.key
        for stat in lake.list_objects(commit, prefix=SCENE_INDEX_PREFIX)
        if stat.key.endswith(".parquet")
    ]
    if not keys:
        return False
    paths = []
    for number, key in enumerate(keys):
        path = workdir / f"{number:06d}.parquet"
        path.write_bytes(lake.get_object(commit, key))
        paths.append(str(path))
    connection.read_parquet(paths, union_by_name=True).to_table(_TABLE)
    return True


def query_scene_index(
    lake: VersionedLake,
    expression: str,
    ref: str = MAIN_BRANCH,
    *,
    limit: int | None = None,
    include_index_only: bool = False,
) -> SceneQueryResult:
    """The scene-index rows at ``ref`` (branch, tag or commit) that ``expression`` selects.

    ``QueryError`` for bad syntax, unknown fields or mistyped values; ``NotFoundError`` from the
    lake when ``ref`` names nothing. A ref with no scene index yet gives no rows (the syntax is
    still checked; the fields cannot be, there being no columns to check them against).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0, got {limit}")
    commit = lake.resolve_ref(ref)
    with tempfile.TemporaryDirectory(prefix="scene-query-") as workdir, duckdb.connect() as con:
        if not _load_objects(con, lake, commit, Path(workdir)):
            parse_query(expression)
            return SceneQueryResult(pd.DataFrame(), commit, expression, "", (), 0)
        rows, compiled, sql, matched = _run(con, expression, limit, include_index_only)
    return SceneQueryResult(rows, commit, expression, sql, tuple(compiled.params), matched)
