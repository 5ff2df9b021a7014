"""A parsed scene query → a parameterized SQL ``WHERE`` clause, checked against a real schema.

Fields are validated against the columns of the table actually being queried (the scene index
grows columns — a new trigger rule adds ``event_<rule>`` — so a hard-coded list would go
stale). Values are always bound parameters and identifiers always quoted, so nothing an
operator types can change the statement's shape.

Every condition is two-valued: a frame whose partition lacks a column (older partitions,
``union_by_name``) or holds NULL there is simply "not matching" an ordering or event test and
"different from" any ``=`` value, so ``NOT x`` is always the complement of ``x``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .query_parser import (
    And,
    Comparison,
    Event,
    Expr,
    Not,
    Number,
    Or,
    QueryError,
    Text,
    parse_query,
)

_NUMERIC = re.compile(
    r"(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|FLOAT|DOUBLE|REAL|DECIMAL.*|UHUGEINT)\Z", re.IGNORECASE
)
_ORDERING = ("<", "<=", ">", ">=")
EVENT_PREFIX = "event_"


def column_kind(sql_type: str) -> str:
    """``number``, ``text``, ``boolean`` or ``other`` for a duckdb column type."""
    upper = sql_type.upper()
    if _NUMERIC.match(upper):
        return "number"
    if upper in ("VARCHAR", "TEXT", "STRING"):
        return "text"
    return "boolean" if upper in ("BOOLEAN", "BOOL") else "other"


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class CompiledQuery:
    """A ``WHERE`` clause with ``?`` placeholders and the values bound to them, in order."""

    where: str
    params: tuple[Any, ...]


def _suggestion(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


class _Compiler:
    def __init__(self, columns: Mapping[str, str], source: str) -> None:
        self.kinds = {name: column_kind(sql_type) for name, sql_type in columns.items()}
        self.source = source
        self.params: list[Any] = []

    def compile(self, expr: Expr) -> str:
        if isinstance(expr, Comparison):
            return self.comparison(expr)
        if isinstance(expr, Event):
            return self.event(expr)
        if isinstance(expr, Not):
            return f"(NOT {self.compile(expr.operand)})"
        joiner = " AND " if isinstance(expr, And) else " OR "
        assert isinstance(expr, And | Or)
        return "(" + joiner.join(self.compile(operand) for operand in expr.operands) + ")"

    def event(self, expr: Event) -> str:
        column = EVENT_PREFIX + expr.name
        if self.kinds.get(column) != "boolean":
            events = sorted(
                n[len(EVENT_PREFIX) :] for n in self.kinds if n.startswith(EVENT_PREFIX)
            )
            raise QueryError(
                f"unknown event {expr.name!r}: {_suggestion(expr.name, events)}"
                f"known events: {', '.join(events) or 'none'}",
                self.source,
                expr.position,
            )
        return f"COALESCE({quote_identifier(column)}, FALSE)"

    def comparison(self, expr: Comparison) -> str:
        kind = self.kinds.get(expr.field)
        if kind is None:
            known = sorted(self.kinds)
            raise QueryError(
                f"unknown field {expr.field!r}: {_suggestion(expr.field, known)}"
                f"known fields: {', '.join(known)}",
                self.source,
                expr.position,
            )
        self.params.append(self.bound_value(expr, kind))
        column = quote_identifier(expr.field)
        if expr.op == "=":
            return f"({column} IS NOT DISTINCT FROM ?)"
        if expr.op == "!=":
            return f"({column} IS DISTINCT FROM ?)"
        return f"COALESCE({column} {expr.op} ?, FALSE)"

    def bound_value(self, expr: Comparison, kind: str) -> Any:
        """The Python value to bind for ``expr``, or ``QueryError`` when the types disagree."""
        value = expr.value
        if kind == "number":
            if not isinstance(value, Number):
                raise self.value_error(expr, f"field {expr.field!r} is numeric", "a number")
            return value.value
        if kind == "other":
            raise QueryError(f"field {expr.field!r} cannot be queried", self.source, expr.position)
        if expr.op in _ORDERING:
            raise QueryError(
                f"field {expr.field!r} is {kind}: it takes = and != only, not {expr.op!r}",
                self.source,
                expr.position,
            )
        if kind == "text":
            return value.text if isinstance(value, Number) else value.value
        if isinstance(value, Text) and value.value.lower() in ("true", "false"):
            return value.value.lower() == "true"
        raise self.value_error(expr, f"field {expr.field!r} is boolean", "true or false")

    def value_error(self, expr: Comparison, what: str, wanted: str) -> QueryError:
        shown = expr.value.text if isinstance(expr.value, Number) else expr.value.value
        return QueryError(
            f"{what}: expected {wanted}, got {shown!r}", self.source, expr.value_position
        )


def compile_where(expr: Expr, columns: Mapping[str, str], source: str = "") -> CompiledQuery:
    """``expr`` as a WHERE clause over a table whose ``columns`` map name → duckdb type."""
    compiler = _Compiler(columns, source)
    where = compiler.compile(expr)
    return CompiledQuery(where, tuple(compiler.params))


def compile_query(source: str, columns: Mapping[str, str]) -> CompiledQuery:
    """Parse ``source`` and compile it against ``columns`` (``QueryError`` for either step)."""
    return compile_where(parse_query(source), columns, source)
