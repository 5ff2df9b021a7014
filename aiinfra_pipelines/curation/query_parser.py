"""The scene query language: text → a small typed syntax tree.

One expression names a slice of the fleet's scenes the same way everywhere — on the command
line, in a dataset definition, in a trigger proposal — so the grammar is deliberately tiny and
the errors point at the exact character an operator got wrong::

    expression := or_expr
    or_expr    := and_expr ("OR" and_expr)*
    and_expr   := not_expr ("AND" not_expr)*
    not_expr   := "NOT" not_expr | primary
    primary    := "(" or_expr ")" | "event" ":" NAME | FIELD OP value
    OP         := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    value      := NUMBER | "quoted string" | 'quoted string' | bare-word

Keywords are case-insensitive. Bare words are runs of letters, digits and ``_ - . / +`` (so
``slice=night/fog/merge`` needs no quotes); anything else, or a keyword used as a value, is
quoted. Whether a field exists and what its value must be is decided against the real table
by :mod:`.query_compiler`, not here: the parser knows no schema.

An expression is bounded before it is parsed or run (``resources/query.yaml`` ``limits``):
its length, nesting depth, number of terms and the size of its literals, each refused as a
``QueryError`` naming the limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

KEYWORDS = frozenset({"and", "or", "not"})
OPERATORS = ("<=", ">=", "!=", "==", "=", "<", ">")
_BARE = re.compile(r"[A-Za-z0-9_.\-/+]+")
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\Z")


@dataclass(frozen=True)
class QueryLimits:
    """``query.yaml`` ``limits``: what one expression may ask for."""

    max_expression_chars: int
    max_depth: int
    max_terms: int
    max_number_digits: int
    max_abs_number: float
    max_string_chars: int

    @classmethod
    def load(cls, config: Mapping[str, Any] | None = None) -> QueryLimits:
        section = settings_section("query.yaml", "limits", config)
        return cls(
            max_expression_chars=section.int("max_expression_chars"),
            max_depth=section.int("max_depth"),
            max_terms=section.int("max_terms"),
            max_number_digits=section.int("max_number_digits"),
            max_abs_number=section.float("max_abs_number"),
            max_string_chars=section.int("max_string_chars"),
        )


class QueryError(ValueError):
    """A query that cannot run: bad syntax, an unknown field or a value of the wrong type.

    ``message`` is one line (the CLI prints it as is); ``str()`` adds the expression with a
    caret under ``position`` so code that logs the error shows where it went wrong.
    """

    def __init__(self, message: str, expression: str = "", position: int | None = None) -> None:
        self.message = message if position is None else f"{message} (at column {position + 1})"
        self.expression = expression
        self.position = position
        super().__init__(self.message)

    @property
    def caret(self) -> str:
        """The expression and a caret under the offending character ("" without a position)."""
        if self.position is None:
            return ""
        return f"  {self.expression}\n  {' ' * self.position}^"

    def __str__(self) -> str:
        return f"{self.message}\n{self.caret}" if self.caret else self.message


# ------------------------------------------------------------------------------------ syntax tree
@dataclass(frozen=True)
class Number:
    """A numeric literal; ``text`` is kept so a text field compared with ``1.2`` sees "1.2"."""

    value: int | float
    text: str


@dataclass(frozen=True)
class Text:
    value: str
    quoted: bool


Value = Number | Text


@dataclass(frozen=True)
class Comparison:
    field: str
    op: str  # one of = != < <= > >= (``==`` is normalized to ``=``)
    value: Value
    position: int  # of the field, for errors found later against the schema
    value_position: int


@dataclass(frozen=True)
class Event:
    """``event:NAME``: the frame is flagged by trigger rule NAME (column ``event_NAME``)."""

    name: str
    position: int


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Expr, ...]


Expr = Comparison | Event | Not | And | Or


# ----------------------------------------------------------------------------------------- lexer
@dataclass(frozen=True)
class Token:
    kind: str  # "(" ")" ":" "op" "string" "word" "end"
    text: str
    position: int

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        return repr(self.text) if self.kind != "string" else f"quoted string {self.text!r}"


def _quoted(source: str, start: int) -> tuple[Token, int]:
    """A quoted string starting at ``start``; backslash escapes the next character."""
    quote, chars, index = source[start], [], start + 1
    while index < len(source):
        char = source[index]
        if char == "\\" and index + 1 < len(source):
            chars.append(source[index + 1])
            index += 2
            continue
        if char == quote:
            return Token("string", "".join(chars), start), index + 1
        chars.append(char)
        index += 1
    raise QueryError(f"unterminated string: no closing {quote}", source, start)


def _next_token(source: str, index: int) -> tuple[Token, int]:
    char = source[index]
    if char in "():":
        return Token(char, char, index), index + 1
    for op in OPERATORS:
        if source.startswith(op, index):
            return Token("op", "=" if op == "==" else op, index), index + len(op)
    if char in "\"'":
        return _quoted(source, index)
    bare = _BARE.match(source, index)
    if bare:
        return Token("word", bare.group(), index), bare.end()
    raise QueryError(f"unexpected character {char!r}", source, index)


def tokenize(source: str) -> list[Token]:
    """Every token of ``source``, ending with an ``end`` token."""
    tokens, index = [], 0
    while index < len(source):
        if source[index].isspace():
            index += 1
            continue
        token, index = _next_token(source, index)
        tokens.append(token)
    tokens.append(Token("end", "", len(source)))
    return tokens


# ---------------------------------------------------------------------------------------- parser
class _Parser:
    def __init__(self, source: str, limits: QueryLimits) -> None:
        self.source = source
        self.limits = limits
        if len(source) > limits.max_expression_chars:
            raise QueryError(
                f"expression of {len(source)} characters is longer than the "
                f"{limits.max_expression_chars} allowed (query.yaml limits)"
            )
        self.tokens = tokenize(source)
        self.index = 0
        self.depth = 0
        self.terms = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.token
        self.index += 1
        return token

    def error(self, message: str, token: Token | None = None) -> QueryError:
        return QueryError(message, self.source, (token or self.token).position)

    def keyword(self, word: str) -> bool:
        return self.token.kind == "word" and self.token.text.lower() == word

    def parse(self) -> Expr:
        if self.token.kind == "end":
            raise QueryError("empty expression: write a condition such as weather=fog")
        expr = self.or_expr()
        if self.token.kind != "end":
            raise self.error(f"expected AND, OR or the end, found {self.token.describe()}")
        return expr

    def or_expr(self) -> Expr:
        operands = [self.and_expr()]
        while self.keyword("or"):
            self.advance()
            operands.append(self.and_expr())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def and_expr(self) -> Expr:
        operands = [self.not_expr()]
        while self.keyword("and"):
            self.advance()
            operands.append(self.not_expr())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def deeper(self) -> None:
        """One more level of nesting (a parenthesis or a NOT), refused past the limit."""
        self.depth += 1
        if self.depth > self.limits.max_depth:
            raise self.error(
                f"nested more than {self.limits.max_depth} levels deep (query.yaml limits)"
            )

    def term(self) -> None:
        """One more comparison or event test, refused past the limit."""
        self.terms += 1
        if self.terms > self.limits.max_terms:
            raise self.error(f"more than {self.limits.max_terms} terms (query.yaml limits)")

    def not_expr(self) -> Expr:
        if self.keyword("not"):
            self.advance()
            self.deeper()
            operand = self.not_expr()
            self.depth -= 1
            return Not(operand)
        return self.primary()

    def primary(self) -> Expr:
        if self.token.kind == "(":
            opening = self.advance()
            self.deeper()
            expr = self.or_expr()
            if self.token.kind != ")":
                raise self.error(
                    f"expected ')' to close the '(' at column {opening.position + 1}, "
                    f"found {self.token.describe()}"
                )
            self.advance()
            self.depth -= 1
            return expr
        self.term()
        if self.keyword("event") and self.tokens[self.index + 1].kind == ":":
            return self.event()
        return self.comparison()

    def event(self) -> Event:
        start = self.advance()
        self.advance()  # the colon
        name = self.token
        if name.kind != "word" or not _FIELD.match(name.text):
            raise self.error(
                f"expected a trigger rule name after 'event:', found {name.describe()}"
            )
        self.advance()
        return Event(name.text, start.position)

    def comparison(self) -> Comparison:
        field = self.token
        if field.kind != "word" or not _FIELD.match(field.text) or field.text.lower() in KEYWORDS:
            raise self.error(f"expected a field name, 'event:' or '(', found {field.describe()}")
        self.advance()
        if self.token.kind != "op":
            raise self.error(
                f"expected an operator (= != < <= > >=) after {field.text!r}, "
                f"found {self.token.describe()}"
            )
        op = self.advance().text
        value_token = self.token
        return Comparison(field.text, op, self.value(op), field.position, value_token.position)

    def value(self, op: str) -> Value:
        token = self.token
        if token.kind in ("string", "word") and len(token.text) > self.limits.max_string_chars:
            raise self.error(
                f"a value of {len(token.text)} characters is longer than the "
                f"{self.limits.max_string_chars} allowed (query.yaml limits)"
            )
        if token.kind == "string":
            self.advance()
            return Text(token.text, quoted=True)
        if token.kind != "word" or token.text.lower() in KEYWORDS:
            hint = " (quote a keyword to compare with the word)" if token.kind == "word" else ""
            raise self.error(f"expected a value after {op!r}, found {token.describe()}{hint}")
        if _NUMBER.match(token.text):
            return self.number(token)
        self.advance()
        return Text(token.text, quoted=False)

    def number(self, token: Token) -> Number:
        """A numeric literal within the limits (digits, magnitude, finite)."""
        digits = sum(char.isdigit() for char in token.text.split("e")[0].split("E")[0])
        number = float(token.text)
        if digits > self.limits.max_number_digits or not (
            math.isfinite(number) and abs(number) <= self.limits.max_abs_number
        ):
            raise self.error(
                f"number {token.text[:24]}{'…' if len(token.text) > 24 else ''} is outside "
                f"the range a query compares with (at most {self.limits.max_number_digits} "
                f"digits, magnitude {self.limits.max_abs_number:g}; query.yaml limits)"
            )
        self.advance()
        exact = number.is_integer() and not re.search(r"[.eE]", token.text)
        return Number(int(token.text) if exact else number, token.text)


def parse_query(source: str, limits: QueryLimits | None = None) -> Expr:
    """The syntax tree of ``source``; ``QueryError`` with a position for bad syntax or an
    expression past ``limits`` (default: ``resources/query.yaml``)."""
    return _Parser(source, limits or QueryLimits.load()).parse()


def referenced_fields(expr: Expr) -> list[str]:
    """The table columns ``expr`` reads, in first-mention order (``event:x`` reads event_x)."""
    if isinstance(expr, Comparison):
        return [expr.field]
    if isinstance(expr, Event):
        return [f"event_{expr.name}"]
    children = (expr.operand,) if isinstance(expr, Not) else expr.operands
    return list(dict.fromkeys(field for child in children for field in referenced_fields(child)))
