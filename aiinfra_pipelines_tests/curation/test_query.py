"""The scene query language: parsing, compiling against a schema, and running on a real lake."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.curation.query import query_frame, query_scene_index
from aiinfra_pipelines.curation.query_compiler import compile_query
from aiinfra_pipelines.curation.query_parser import (
    And,
    Comparison,
    Event,
    Not,
    Number,
    Or,
    QueryError,
    QueryLimits,
    Text,
    parse_query,
    referenced_fields,
)
from aiinfra_pipelines.environment import build_lake, load_environment
from aiinfra_pipelines.ingest.tables import scene_index_table, trigger_rule_names
from aiinfra_pipelines.lake.io_manager import asset_object_base, parquet_bytes
from aiinfra_pipelines.lake.publish import publish_objects

COLUMNS = {
    "weather": "VARCHAR",
    "road_type": "VARCHAR",
    "software_version": "VARCHAR",
    "speed_mps": "DOUBLE",
    "frame_index": "BIGINT",
    "event_low_ttc": "BOOLEAN",
    "event_hard_brake": "BOOLEAN",
    "raw_available": "BOOLEAN",
    "ground_truth_blob": "BLOB",
}


def cmp(field: str, op: str, value: str | int | float) -> Comparison:
    """A comparison as the parser builds it, positions aside (compared via ``_shape``)."""
    literal = Number(value, str(value)) if not isinstance(value, str) else Text(value, False)
    return Comparison(field, op, literal, 0, 0)


def _shape(expr):
    """``expr`` with positions zeroed, so tests compare structure only."""
    if isinstance(expr, Comparison):
        return Comparison(expr.field, expr.op, expr.value, 0, 0)
    if isinstance(expr, Event):
        return Event(expr.name, 0)
    if isinstance(expr, Not):
        return Not(_shape(expr.operand))
    return type(expr)(tuple(_shape(operand) for operand in expr.operands))


def error_of(source: str, columns: dict[str, str] | None = None) -> QueryError:
    with pytest.raises(QueryError) as caught:
        compile_query(source, COLUMNS if columns is None else columns)
    return caught.value


# ------------------------------------------------------------------------------------- parsing
def test_and_binds_tighter_than_or_and_not_tightest() -> None:
    parsed = _shape(parse_query("weather=fog OR NOT road_type=merge and speed_mps>20"))
    assert parsed == Or(
        (
            cmp("weather", "=", "fog"),
            And((Not(cmp("road_type", "=", "merge")), cmp("speed_mps", ">", 20))),
        )
    )


def test_parentheses_override_precedence_and_nest() -> None:
    parsed = _shape(parse_query("(weather=fog OR weather=rain) AND NOT (event:low_ttc)"))
    assert parsed == And(
        (
            Or((cmp("weather", "=", "fog"), cmp("weather", "=", "rain"))),
            Not(Event("low_ttc", 0)),
        )
    )
    assert _shape(parse_query("((speed_mps>=1))")) == cmp("speed_mps", ">=", 1)


def test_every_operator_and_value_form() -> None:
    ops = [_shape(parse_query(f"speed_mps{op}2.5")).op for op in ("=", "==", "!=", "<", "<=", ">")]
    assert ops == ["=", "=", "!=", "<", "<=", ">"]
    assert parse_query("speed_mps>-3").value == Number(-3, "-3")
    assert parse_query("speed_mps<1e2").value == Number(100.0, "1e2")
    assert parse_query("slice=night/fog/merge").value == Text("night/fog/merge", False)
    assert parse_query("city='San Jose'").value == Text("San Jose", True)
    assert parse_query('city="say \\"hi\\""').value == Text('say "hi"', True)
    assert parse_query("weather='AND'").value == Text("AND", True)
    parsed = parse_query("Event:low_ttc aNd weather=fog")
    assert _shape(parsed) == And((Event("low_ttc", 0), cmp("weather", "=", "fog")))


def test_referenced_fields_in_first_mention_order() -> None:
    parsed = parse_query("speed_mps>1 AND (event:low_ttc OR NOT weather=fog) AND speed_mps<9")
    assert referenced_fields(parsed) == ["speed_mps", "event_low_ttc", "weather"]


@pytest.mark.parametrize(
    ("source", "message", "column"),
    [
        ("weather=", "expected a value after '=', found end of expression", 9),
        ("weather fog", "expected an operator (= != < <= > >=) after 'weather', found 'fog'", 9),
        ("weather=fog road_type=merge", "expected AND, OR or the end, found 'road_type'", 13),
        ("(weather=fog", "expected ')' to close the '(' at column 1", 13),
        ("weather=fog)", "expected AND, OR or the end, found ')'", 12),
        ('weather="fog', 'unterminated string: no closing "', 9),
        ("weather=fog & x", "unexpected character '&'", 13),
        ("weather=AND", "quote a keyword to compare with the word", 9),
        ("weather=fog AND", "expected a field name, 'event:' or '(', found end of expression", 16),
        ("=fog", "expected a field name, 'event:' or '(', found '='", 1),
        ("event:", "expected a trigger rule name after 'event:', found end of expression", 7),
        ("NOT", "expected a field name", 4),
    ],
)
def test_syntax_errors_name_the_column_and_draw_a_caret(
    source: str, message: str, column: int
) -> None:
    error = error_of(source)
    assert message in error.message and error.message.endswith(f"(at column {column})")
    assert error.position == column - 1
    assert str(error).splitlines()[1:] == [f"  {source}", "  " + " " * (column - 1) + "^"]
    assert "\n" not in error.message


def test_an_empty_expression_is_refused() -> None:
    for source in ("", "   "):
        assert error_of(source).message.startswith("empty expression")


# ----------------------------------------------------------------------------------- compiling
def test_compiles_to_a_parameterized_where_clause() -> None:
    compiled = compile_query(
        "weather=fog AND road_type=merge AND event:low_ttc AND speed_mps>20", COLUMNS
    )
    assert compiled.where == (
        '(("weather" IS NOT DISTINCT FROM ?) AND ("road_type" IS NOT DISTINCT FROM ?)'
        ' AND COALESCE("event_low_ttc", FALSE) AND COALESCE("speed_mps" > ?, FALSE))'
    )
    assert compiled.params == ("fog", "merge", 20)


def test_values_never_reach_the_sql_text() -> None:
    hostile = "weather='x\\' OR 1=1; DROP TABLE scene_index; --'"
    compiled = compile_query(hostile, COLUMNS)
    assert compiled.where == '("weather" IS NOT DISTINCT FROM ?)'
    assert compiled.params == ("x' OR 1=1; DROP TABLE scene_index; --",)


def test_values_take_the_column_type() -> None:
    assert compile_query("software_version=1.20", COLUMNS).params == ("1.20",)
    assert compile_query("raw_available=FALSE", COLUMNS).params == (False,)
    assert compile_query("raw_available!=true", COLUMNS).params == (True,)
    assert compile_query("frame_index<=3", COLUMNS).params == (3,)


@pytest.mark.parametrize(
    ("source", "message", "column"),
    [
        ("weathr=fog", "unknown field 'weathr': did you mean 'weather'? known fields: ", 1),
        ("event:lowttc", "unknown event 'lowttc': did you mean 'low_ttc'? known events: ", 1),
        ("speed_mps>fast", "field 'speed_mps' is numeric: expected a number, got 'fast'", 11),
        ("speed_mps='20'", "field 'speed_mps' is numeric: expected a number, got '20'", 11),
        ("weather<fog", "field 'weather' is text: it takes = and != only, not '<'", 1),
        ("raw_available>=true", "field 'raw_available' is boolean: it takes = and != only", 1),
        ("raw_available=yes", "field 'raw_available' is boolean: expected true or false", 15),
        ("ground_truth_blob=x", "field 'ground_truth_blob' cannot be queried", 1),
    ],
)
def test_schema_errors_name_the_field(source: str, message: str, column: int) -> None:
    error = error_of(source)
    assert message in error.message and error.message.endswith(f"(at column {column})")


def test_unknown_field_lists_the_known_ones() -> None:
    message = error_of("zzz=1").message
    assert "did you mean" not in message
    assert "known fields: event_hard_brake, event_low_ttc, frame_index, " in message
    assert "known events: hard_brake, low_ttc" in error_of("event:zzz").message
    assert "known events: none" in error_of("event:x", {"weather": "VARCHAR"}).message


# ------------------------------------------------------------------------------ in-memory frames
def test_query_frame_is_two_valued_and_hides_index_only_rows() -> None:
    frame = pd.DataFrame(
        {
            "log_id": ["a", "a", "b", "c"],
            "frame_index": [1, 0, 0, 0],
            "weather": ["fog", "fog", None, "fog"],
            "speed_mps": [25.0, 10.0, None, 22.0],
            "event_low_ttc": [True, False, None, True],
            "raw_available": [True, True, True, False],
        }
    )
    fast = query_frame(frame, "speed_mps > 20")
    assert fast.rows[["log_id", "frame_index"]].values.tolist() == [["a", 1]]
    assert query_frame(frame, "NOT speed_mps>20").rows["log_id"].tolist() == ["a", "b"]
    assert query_frame(frame, "weather!=fog").rows["log_id"].tolist() == ["b"]
    assert query_frame(frame, "NOT event:low_ttc").rows["log_id"].tolist() == ["a", "b"]
    with_held = query_frame(frame, "event:low_ttc", include_index_only=True)
    assert with_held.rows["log_id"].tolist() == ["a", "c"] and with_held.matched == 2
    limited = query_frame(frame, "weather=fog", limit=1)
    assert len(limited.rows) == 1 and limited.matched == 2 and limited.commit == ""


# ----------------------------------------------------------------------------------- on a lake
def _index(log_id: str, weather: str, road_type: str, speeds: list[float], **kw) -> pd.DataFrame:
    """A scene-index partition built by ingest's own table function from a small frames table."""
    timestamps = np.arange(len(speeds), dtype=np.int64) * 100_000_000
    frames = pd.DataFrame(
        {
            "frame_index": range(len(speeds)),
            "timestamp_ns": timestamps,
            "latitude": 37.0,
            "longitude": -122.0,
            "speed_mps": speeds,
            "accel_mps2": 0.0,
            "steering_rad": 0.0,
            "brake": 0.0,
            "lane_index": 1,
            "lane_count": 3,
            "ground_truth": "[]",
        }
    )
    partition = f"ingest-q/logs/{log_id}.mcap"
    return scene_index_table(
        frames,
        tags={"log_id": log_id, "weather": weather, "road_type": road_type, "lighting": "day"},
        events=[(int(timestamps[-1]), "low_ttc")],
        rule_names=trigger_rule_names(),
        source_branch="ingest-q",
        source_commit="0" * 64,
        log_key=f"logs/{log_id}.mcap",
        frames_object=asset_object_base(dg.AssetKey("anonymized_frames"), partition) + ".parquet",
        **kw,
    )


def _publish(lake, tables: list[pd.DataFrame], name: str) -> str:
    """Publish scene-index partitions to main at the IO manager's keys, as ingest does."""
    objects = {
        asset_object_base(dg.AssetKey("scene_index"), f"ingest-q/logs/{t['log_id'][0]}.mcap")
        + ".parquet": parquet_bytes(t)
        for t in tables
    }
    return publish_objects(lake, f"test-{name}", objects, f"scene index {name}", {})


@pytest.fixture
def lake(dagster_home):
    lake = build_lake(load_environment())  # the lake the CLI opens
    lake.ensure_repository()
    return lake


@pytest.fixture
def published(lake) -> tuple[str, str]:
    first = _publish(lake, [_index("fog-merge-1", "fog", "merge", [18.0, 21.0, 24.0])], "one")
    second = _publish(
        lake,
        [
            _index("fog-merge-2", "fog", "merge", [30.0, 31.0]),
            _index("clear-highway", "clear", "highway", [25.0, 26.0]),
            _index("fog-merge-held", "fog", "merge", [40.0], raw_available=False),
        ],
        "two",
    )
    return first, second


QUERY = "weather=fog AND road_type=merge AND event:low_ttc AND speed_mps>20"


def test_query_at_a_branch_and_at_an_older_commit(lake, published) -> None:
    first, second = published
    now = query_scene_index(lake, QUERY)
    assert now.commit == second == lake.resolve_ref("main")
    assert now.rows[["log_id", "frame_index"]].values.tolist() == [
        ["fog-merge-1", 2],
        ["fog-merge-2", 1],
    ]
    assert {"slice", "source_commit", "raw_available"} <= set(now.rows.columns)
    then = query_scene_index(lake, QUERY, first)
    assert then.commit == first and then.rows["log_id"].tolist() == ["fog-merge-1"]

    lake.create_tag("before-two", first)
    assert query_scene_index(lake, "speed_mps>0", "before-two").matched == 3
    held = query_scene_index(lake, QUERY, include_index_only=True)
    assert held.rows["log_id"].tolist() == ["fog-merge-1", "fog-merge-2", "fog-merge-held"]
    assert len(query_scene_index(lake, "weather=fog", limit=2).rows) == 2


def test_query_errors_on_the_lake(lake, published) -> None:
    with pytest.raises(QueryError, match="unknown field 'wether': did you mean 'weather'"):
        query_scene_index(lake, "wether=fog")
    with pytest.raises(QueryError, match="unknown event 'no_such_rule'"):
        query_scene_index(lake, "event:no_such_rule")


def test_a_ref_without_a_scene_index_has_no_rows_but_checks_syntax(lake) -> None:
    empty = query_scene_index(lake, "anything=1")
    assert empty.rows.empty and empty.commit == lake.resolve_ref("main")
    with pytest.raises(QueryError, match="expected a value"):
        query_scene_index(lake, "anything=")


runner = CliRunner()


def test_cli_query_json_table_and_errors(lake, published, monkeypatch) -> None:
    _, second = published
    # The CLI's rich console reads COLUMNS on every print; setting its width instead would
    # leave it pinned after the test (monkeypatch restores a property by setting it).
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["query", QUERY, "--json"], terminal_width=200)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["commit"] == second and report["expression"] == QUERY
    assert report["count"] == report["matched"] == 2
    assert [row["log_id"] for row in report["rows"]] == ["fog-merge-1", "fog-merge-2"]
    assert all(row["event_low_ttc"] is True for row in report["rows"])

    table = runner.invoke(app, ["query", QUERY, "--limit", "1"], terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "2 frame(s) match at main" in table.output and "showing 1" in table.output
    assert "fog-merge-1" in table.output and "speed_mps" in table.output

    bad = runner.invoke(app, ["query", "weather=fog AND"], terminal_width=200)
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == [
        "query error: expected a field name, 'event:' or '(', found end of expression "
        "(at column 16)"
    ]
    unknown = runner.invoke(app, ["query", "wether=fog"], terminal_width=200)
    assert unknown.exit_code == 2 and "did you mean 'weather'" in unknown.stderr
    missing = runner.invoke(app, ["query", "weather=fog", "--ref", "nope"], terminal_width=200)
    assert missing.exit_code == 2 and "no lake ref 'nope'" in missing.output


def test_an_expression_past_the_limits_is_refused_naming_the_limit():
    """resources/query.yaml bounds an expression before it is parsed or run: 300 nested
    parentheses ended in a RecursionError, 5,000 AND terms took 4 GB, a 50-digit integer
    reached duckdb."""
    limits = QueryLimits.load()
    deep = "(" * (limits.max_depth + 1) + "weather=fog" + ")" * (limits.max_depth + 1)
    with pytest.raises(QueryError, match=rf"nested more than {limits.max_depth} levels"):
        parse_query(deep)
    with pytest.raises(QueryError, match=r"nested more than"):
        parse_query("NOT " * (limits.max_depth + 1) + "weather=fog")
    parse_query("(" * limits.max_depth + "weather=fog" + ")" * limits.max_depth)  # at the limit
    wide = " AND ".join(["weather=fog"] * (limits.max_terms + 1))
    with pytest.raises(QueryError, match=rf"more than {limits.max_terms} terms"):
        parse_query(wide)
    with pytest.raises(QueryError, match="outside the range"):
        parse_query("speed_mps > " + "9" * 50)
    with pytest.raises(QueryError, match="outside the range"):
        parse_query("speed_mps > 1e400")
    with pytest.raises(QueryError, match="characters is longer"):
        parse_query("weather=" + "x" * 5000)
    assert parse_query("speed_mps > 123456789012345678")  # 18 digits: a BIGINT holds it
