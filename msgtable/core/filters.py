"""Subscription filters: user text that chooses messages, checked, and never SQL itself.

A filter is parsed (lark, LALR), only known node types are accepted, every name must be a
column of the table, every literal is checked against its column's type, and the result is
a :class:`Filter`: a parenthesised WHERE fragment (column names quoted, every literal a
``%s`` DBAPI parameter; pass ``params`` even when empty, so that ``%%`` in a quoted name
becomes ``%``) and a Python evaluation on one row (:meth:`Filter.matches`).

Two syntaxes. The **ODPS matcher** shorthand is chosen when the whole text is one or more
``key=value(|value)*`` joined by commas: keys are plain names, values non-empty runs of any
characters but ``, | = ' " ( )`` and whitespace (whitespace around tokens is allowed);
``region=eu|us,kind=order`` means ``(region IN ('eu','us')) AND (kind = 'order')``. Values
are converted to the column's type as string literals are. Anything else is a **selector**
(SQL-like, as JMS/AMQP selectors; keywords in any case)::

    filter    := or  ;  or := and (OR and)*  ;  and := not (AND not)*
    not       := NOT not | '(' or ')' | predicate
    predicate := column op literal | literal op column        op: = <> != < <= > >=
               | column [NOT] IN '(' literal (',' literal)* ')'
               | column [NOT] BETWEEN literal AND literal
               | column [NOT] LIKE 'pattern' [ESCAPE 'c']     % any run, _ one character;
               | column IS [NOT] NULL                         the default escape is \\
    column    := [A-Za-z_][A-Za-z0-9_]* (not a keyword) | `back``quoted`   (any case)
    literal   := number (1, -2, 1.5, 1e3) | 'string' ('' is a quote; \\ is plain) | TRUE | FALSE

Nothing else: no column against column, no functions, subqueries, arithmetic, comments,
``;``, double-quoted strings, or NULL outside IS [NOT] NULL. A text that reads both ways
(``amount = 5``) is the matcher, which means the same; TRUE/FALSE read alike in both.

Types (information_schema's DATA_TYPE): the integers and YEAR take integers (``2.0`` and
``1e3`` are, ``1.5`` is an error; TRUE/FALSE are 1/0, and only here); DECIMAL takes numbers
as ``Decimal`` (at most 65 digits), FLOAT/DOUBLE numbers as ``float`` (as MySQL compares a
literal with a double); CHAR, VARCHAR, the TEXTs, ENUM and SET take strings; BINARY,
VARBINARY and the BLOBs strings, bound as UTF-8 bytes; DATE takes 'YYYY-MM-DD', DATETIME and
TIMESTAMP 'YYYY-MM-DD[ HH:MM:SS[.ffffff]]', TIME '[-]H:MM:SS[.ffffff]' (up to 838 hours),
each bound as a checked date, datetime or time. A string that reads as a number is a
number for a numeric column; in a selector a number is never a string (quote it). JSON,
spatial, BIT and any other column can only be tested with IS [NOT] NULL (MariaDB reports
JSON as LONGTEXT: there it is text). LIKE needs a text or binary column.

Limits: at most MAX_FILTER_CHARS characters, MAX_IN_ITEMS items in one IN list (or values
of one matcher key), MAX_DEPTH levels of parentheses and NOTs; an empty filter is an
error. Every error is an InvalidArgument of one line, ``filter: at position N: reason``,
N the 1-based character of the text as given.

Python against SQL: :meth:`Filter.matches` follows SQL's three-valued logic (NULL, or a
column missing from the row, is unknown, and unknown is not matched); compares numbers,
dates and times by value (not as strings), binary strings byte for byte, and text
case-insensitively (``casefold``; LIKE with ``re.IGNORECASE``), as MySQL's default ``*_ci``
collations do. Text agrees on ASCII letters and digits; it may differ where a collation has
rules of its own: accents and other non-ASCII folding (``utf8mb4_0900_ai_ci`` ignores
accents, casefold does not), trailing spaces (PAD SPACE collations ignore them in ``=`` and
``<``, NO PAD ones and Python do not), and the order of punctuation against letters in
``<``, ``>`` and BETWEEN (general_ci sorts ``_`` after ``Z``, casefold and the 0900
collations before ``a``). YEAR compares as an integer (write four digits). A row value of
another Python type than its column's (a zero date read as a string) is unknown.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

import lark
from lark import Token, Tree

from msgtable.core.sql import placeholders, quote
from msgtable.core.sqltypes import (
    BINARY_TYPES,
    CHOICE_TYPES,
    DATE,
    DATETIME,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    INTEGER_TYPES,
    TEXT_TYPES,
    TIME,
    TIMESTAMP,
    YEAR,
)
from msgtable.core.tables import Column
from msgtable.errors import InvalidArgument

MAX_FILTER_CHARS = 4000
MAX_IN_ITEMS = 1000
MAX_DEPTH = 32

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: NOT not_expr -> negation
         | LPAR or_expr _RPAR -> group
         | predicate
predicate: operand COMPOP operand -> compare
         | name NOT? _IN LPAR literal (_COMMA literal)* _RPAR -> in_list
         | name NOT? _BETWEEN literal _AND literal -> between
         | name NOT? _LIKE STRING (_ESCAPE STRING)? -> like
         | name _IS NOT? _NULL -> is_null
?operand: name | literal
name: NAME | QUOTED_NAME
literal: NUMBER | STRING | TRUE | FALSE
COMPOP: "=" | "<>" | "!=" | "<=" | ">=" | "<" | ">"
LPAR: "("
_RPAR: ")"
_COMMA: ","
_OR: "or"i
_AND: "and"i
NOT: "not"i
_IN: "in"i
_BETWEEN: "between"i
_LIKE: "like"i
_ESCAPE: "escape"i
_IS: "is"i
_NULL: "null"i
TRUE: "true"i
FALSE: "false"i
NAME: /[A-Za-z_][A-Za-z0-9_]*/
QUOTED_NAME: /`(?:[^`]|``)+`/
NUMBER: /[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?/
STRING: /'(?:[^']|'')*'/
%ignore /\s+/
"""


@functools.cache
def _parser() -> lark.Lark:
    """The filter parser, built the first time a filter is parsed (building it takes a
    tenth of a second, which every ``msgtable`` command would pay at start-up otherwise)."""
    # the basic lexer reserves keywords everywhere (the contextual one reads `a = null` as a name)
    return lark.Lark(_GRAMMAR, parser="lalr", lexer="basic")


_BOOLS = ("TRUE", "FALSE")
_KEYWORDS = {"and", "or", "not", "in", "between", "like", "escape", "is", "null", "true", "false"}
_SAY = {
    "NAME": "a column",
    "QUOTED_NAME": "a column",
    "NUMBER": "a number",
    "STRING": "a string",
    "COMPOP": "a comparison",
    "LPAR": "(",
    "_RPAR": ")",
    "_COMMA": ",",
    "$END": "the end",
}
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "<>": "<>", "!=": "<>"}
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

_VALUE_TEXT = r"[^,|='\"()\s]+"
_CLAUSE_TEXT = rf"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*({_VALUE_TEXT}(?:\s*\|\s*{_VALUE_TEXT})*)\s*"
_MATCHER = re.compile(rf"{_CLAUSE_TEXT}(?:,{_CLAUSE_TEXT})*")
_CLAUSE, _VALUE = re.compile(_CLAUSE_TEXT), re.compile(_VALUE_TEXT)
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATETIME = re.compile(
    rf"{_DATE.pattern}(?:[ T][0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(?:\.[0-9]{{1,6}})?)?"
)
_TIME = re.compile(r"(-?)([0-9]{1,3}):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]{1,6}))?")


_KINDS = {  # how a column compares, by information_schema's DATA_TYPE
    **dict.fromkeys(INTEGER_TYPES | {YEAR}, "int"),
    **dict.fromkeys(DECIMAL_TYPES, "decimal"),
    **dict.fromkeys(FLOAT_TYPES, "float"),
    **dict.fromkeys(TEXT_TYPES | CHOICE_TYPES, "text"),
    **dict.fromkeys(BINARY_TYPES, "binary"),
    **{DATE: "date", DATETIME: "datetime", TIMESTAMP: "datetime", TIME: "time"},
}


class _Col(NamedTuple):
    name: str
    kind: str
    about: str  # for messages: "column amount (bigint)"


@dataclass(frozen=True)
class _Pred:
    column: str
    kind: str
    op: str  # = <> < <= > >= IN BETWEEN LIKE NULL
    negated: bool = False
    params: tuple[object, ...] = ()
    keys: tuple[object, ...] = ()  # the params as Python compares them (text casefolded)
    like: tuple[tuple[re.Pattern[str], int], ...] = ()  # LIKE's %-separated parts, widths


@dataclass(frozen=True)
class _Bool:
    op: str  # AND OR NOT
    items: tuple[_Node, ...]


_Node = _Pred | _Bool


@dataclass(frozen=True)
class Filter:
    """A checked subscription filter: a WHERE fragment with its parameters, and the same
    test in Python for rows that never go through SQL (see the module docstring)."""

    text: str  # as given (stripped)
    sql: str  # parenthesised, unqualified quoted column names, %s placeholders
    params: tuple[object, ...]
    columns: frozenset[str]  # the columns it reads
    _node: _Node = field(repr=False, compare=False)

    def where(self, alias: str = "") -> tuple[str, tuple[object, ...]]:
        """The fragment with every column qualified as alias.`col` when alias is given."""
        if not alias:
            return self.sql, self.params
        params: list[object] = []
        return _sql(self._node, quote(alias) + ".", params), tuple(params)

    def matches(self, row: Mapping[str, object]) -> bool:
        """True when SQL would select the row: NULL is unknown, and unknown is not matched."""
        return _eval(self._node, row) is True

    @property
    def equality_columns(self) -> tuple[str, ...]:
        """The columns every row it passes has equal to one of a few values: those of its
        top-level AND terms ``col = literal`` and ``col IN (...)``, in the filter's order
        (what an index can look a filter's matches up by; () when there is none)."""
        return tuple(dict.fromkeys(_equalities(self._node)))


def parse_filter(text: str, columns: Sequence[Column], table: str = "") -> Filter:
    """Parse and check a filter against a table's columns (InvalidArgument when it is not
    one; the message is one line: ``filter: at position N: reason``)."""
    stripped = text.strip()
    offset = len(text) - len(text.lstrip())
    if not stripped:
        raise InvalidArgument("filter: at position 1: the filter is empty")
    if len(stripped) > MAX_FILTER_CHARS:
        raise InvalidArgument(
            f"filter: at position {offset + MAX_FILTER_CHARS + 1}:"
            f" longer than {MAX_FILTER_CHARS} characters"
        )
    checker = _Checker(stripped, offset, columns, table)
    broken = None if _MATCHER.fullmatch(stripped) else _matcher_break(stripped)
    if broken:
        raise checker.fail(*broken)
    try:
        node = checker.matcher() if _MATCHER.fullmatch(stripped) else checker.selector()
    except RecursionError:
        raise InvalidArgument(f"filter: at position 1: nested deeper than {MAX_DEPTH}") from None
    params: list[object] = []
    sql = _sql(node, "", params)
    return Filter(stripped, sql, tuple(params), frozenset(checker.used), node)


def _matcher_break(text: str) -> tuple[int, str] | None:
    """Where a filter that starts as ``key=a|b,...`` stops being one, and why, when a ','
    follows its clauses and only that syntax explains them: a trailing or doubled ',', or
    clauses with '|' (the selector would blame the first '|', far from the fault); a
    trailing '|'."""
    m = _MATCHER.match(text)
    mark = text[m.end() : m.end() + 1] if m else ""
    if not m or mark not in (",", "|"):
        return None
    after = text[m.end() + 1 :]
    if not after.strip():
        wanted = "name=value" if mark == "," else "a value"
        return m.end(), f"a {mark!r} with nothing after it (expected {wanted}, or remove it)"
    if mark == "," and ("|" in m[0] or after.lstrip().startswith(",")):
        at = len(text) - len(after.lstrip())
        word = re.match(r"[^,\s]+|,", text[at:])
        return at, f"unexpected {_show(word[0] if word else text[at])} (expected name=value)"
    return None


def _equalities(node: _Node) -> list[str]:
    if isinstance(node, _Pred):
        return [node.column] if node.op in ("=", "IN") and not node.negated else []
    if node.op != "AND":
        return []
    return [c for item in node.items for c in _equalities(item)]


def _sql(node: _Node, prefix: str, params: list[object]) -> str:
    if isinstance(node, _Bool):
        if node.op == "NOT":
            return f"(NOT {_sql(node.items[0], prefix, params)})"
        return "(" + f" {node.op} ".join([_sql(item, prefix, params) for item in node.items]) + ")"
    col, no = prefix + quote(node.column), "NOT " if node.negated else ""
    params.extend(node.params)
    if node.op == "IN":
        return f"({col} {no}IN ({placeholders(len(node.params))}))"
    if node.op == "BETWEEN":
        return f"({col} {no}BETWEEN %s AND %s)"
    if node.op == "LIKE":
        return f"({col} {no}LIKE %s ESCAPE %s)"
    if node.op == "NULL":
        return f"({col} IS {no}NULL)"
    return f"({col} {node.op} %s)"


def _eval(node: _Node, row: Mapping[str, object]) -> bool | None:
    if isinstance(node, _Bool):
        results = [_eval(item, row) for item in node.items]
        if node.op == "NOT":
            return None if results[0] is None else not results[0]
        decisive = node.op == "OR"  # True decides an OR, False an AND
        if decisive in results:
            return decisive
        return None if None in results else not decisive
    value = row.get(node.column)
    if node.op == "NULL":
        return (value is None) != node.negated
    if value is None:
        return None
    try:
        return _test(node, value) != node.negated
    except TypeError:  # a value of another type than the column's (a zero date as text)
        return None


def _test(node: _Pred, value: object) -> bool:
    if node.kind == "text" and isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif node.kind == "binary" and isinstance(value, str):
        value = value.encode()
    if node.op == "LIKE":
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        return _like(text, node.like)
    if node.kind == "text":
        value = str(value).casefold()
    if node.op == "IN":
        return value in node.keys
    if node.op == "BETWEEN":
        return _OPS["<="](node.keys[0], value) and _OPS["<="](value, node.keys[1])
    return _OPS[node.op](value, node.keys[0])


def _like(text: str, parts: tuple[tuple[re.Pattern[str], int], ...]) -> bool:
    """Greedy, leftmost matching of the %-separated parts (each of a fixed width): no
    backtracking, where one regex would take exponential time for %a%a%a%a%b."""
    if len(parts) == 1:
        return parts[0][0].fullmatch(text) is not None
    (first, pos), *middle, (last, width) = parts
    if first.match(text) is None:
        return False
    for part, _ in middle:
        found = part.search(text, pos)
        if found is None:
            return False
        pos = found.end()
    return len(text) - width >= pos and last.fullmatch(text, len(text) - width) is not None


@functools.lru_cache(maxsize=256)
def _like_parts(pattern: str, escape: str, fold: bool) -> tuple[tuple[re.Pattern[str], int], ...]:
    parts: list[tuple[re.Pattern[str], int]] = []
    current: list[str] = []
    chars = iter(pattern)
    flags = re.DOTALL | (re.IGNORECASE if fold else 0)
    for ch in chars:
        if ch == escape:
            current.append(re.escape(next(chars, escape)))  # a trailing escape is itself
        elif ch == "%":
            parts.append((re.compile("".join(current), flags), len(current)))
            current = []
        else:
            current.append("." if ch == "_" else re.escape(ch))
    parts.append((re.compile("".join(current), flags), len(current)))
    return tuple(parts)


def _show(text: str, limit: int = 40) -> str:
    """User text inside a one-line message: quoted, escaped, cut."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _plain(name: str) -> str:
    return name if name.isprintable() else repr(name)


def _start(node: Tree[Token] | Token) -> int:
    while isinstance(node, Tree):
        node = node.children[0]
    return node.start_pos or 0


class _Checker:
    """Turns text into the checked tree, raising InvalidArgument at the first problem."""

    def __init__(self, text: str, offset: int, columns: Sequence[Column], table: str) -> None:
        self.text, self.offset, self.columns, self.table = text, offset, columns, table
        self.exact = {c.name: c for c in columns}
        self.folded = {c.name.casefold(): c for c in reversed(columns)}
        self.used: set[str] = set()

    def fail(self, start: int, reason: str) -> InvalidArgument:
        return InvalidArgument(f"filter: at position {self.offset + start + 1}: {reason}")

    def column(self, name: str, start: int, *, any_type: bool = False) -> _Col:
        col = self.exact.get(name) or self.folded.get(name.casefold())
        if col is None:
            where = f" in table {_plain(self.table)}" if self.table else ""
            names = ", ".join(_plain(c.name) for c in self.columns)
            raise self.fail(start, f"unknown column {_show(name)}{where} (columns: {names})")
        found = _Col(
            col.name,
            _KINDS.get(col.data_type, ""),
            f"column {_plain(col.name)} ({_plain(col.data_type)})",
        )
        if not found.kind and not any_type:
            raise self.fail(start, f"{found.about} cannot be filtered: only IS [NOT] NULL tests it")
        self.used.add(col.name)
        return found

    def value(self, col: _Col, lit: str, text: str, start: int) -> tuple[object, object]:
        """(parameter, Python key) of a literal for a column; lit: number, string or TRUE/FALSE."""
        kind, shown = col.kind, _show(text) if lit == "string" else text
        if lit in _BOOLS:
            if kind != "int":
                raise self.fail(start, f"{lit} is only for integer columns, not {col.about}")
            return int(lit == "TRUE"), int(lit == "TRUE")
        if kind in ("int", "decimal", "float"):
            if not _NUMBER.fullmatch(text):
                raise self.fail(start, f"{shown} is not a number for {col.about}")
            number = _number(text, kind)
            if number is None:
                raise self.fail(start, f"{shown} is out of range for {col.about}")
            if kind == "int" and number != number.to_integral_value():
                raise self.fail(start, f"{shown} is not an integer for {col.about}")
            key = int(number) if kind == "int" else float(number) if kind == "float" else number
            return key, key
        if lit != "string":
            raise self.fail(start, f"{shown} is not a string for {col.about}: quote it")
        if kind in ("text", "binary"):
            return (text, text.casefold()) if kind == "text" else (text.encode(), text.encode())
        with contextlib.suppress(ValueError):
            if kind == "date" and _DATE.fullmatch(text):
                return dt.date.fromisoformat(text), dt.date.fromisoformat(text)
            if kind == "datetime" and _DATETIME.fullmatch(text):
                return dt.datetime.fromisoformat(text), dt.datetime.fromisoformat(text)
            time = _TIME.fullmatch(text)
            if kind == "time" and time and int(time[2]) <= 838:
                sign, h, m, s, us = time.groups()
                micro = int((us or "0").ljust(6, "0"))
                delta = dt.timedelta(
                    hours=int(h), minutes=int(m), seconds=int(s), microseconds=micro
                )
                # a string, as pymysql writes a negative timedelta wrong
                return f"{sign}{h}:{m}:{s}.{micro:06}", -delta if sign else delta
        form = {"date": "YYYY-MM-DD", "datetime": "YYYY-MM-DD HH:MM:SS", "time": "HH:MM:SS"}
        raise self.fail(start, f"{shown} is not a {kind} ({form[kind]}) for {col.about}")

    def matcher(self) -> _Node:
        preds: list[_Node] = []
        for clause in _CLAUSE.finditer(self.text):
            col = self.column(clause[1], clause.start(1))
            values = [(clause.start(2) + v.start(), v[0]) for v in _VALUE.finditer(clause[2])]
            if len(values) > MAX_IN_ITEMS:
                raise self.fail(values[MAX_IN_ITEMS][0], f"more than {MAX_IN_ITEMS} values")
            # TRUE/FALSE as in the selector: `flag=true` reads the same in both syntaxes
            lits = [
                v.upper() if col.kind == "int" and v.upper() in _BOOLS else "string"
                for _, v in values
            ]
            pairs = [self.value(col, lit, v, at) for lit, (at, v) in zip(lits, values, strict=True)]
            params, keys = zip(*pairs, strict=True)
            preds.append(
                _Pred(col.name, col.kind, "=" if len(params) == 1 else "IN", False, params, keys)
            )
        return preds[0] if len(preds) == 1 else _Bool("AND", tuple(preds))

    def selector(self) -> _Node:
        try:
            tree = _parser().parse(self.text)
        except lark.exceptions.UnexpectedCharacters as e:
            raise self.fail(
                e.pos_in_stream or 0, self.bad_character(e.pos_in_stream or 0)
            ) from None
        except lark.exceptions.UnexpectedToken as e:
            # accepts() tries each terminal: LALR's merged states list some that would fail
            accepted: set[str] = e.interactive_parser.accepts()  # type: ignore[no-untyped-call]
            raise self.bad_token(e.token, accepted) from None
        except lark.exceptions.LarkError:  # UnexpectedEOF is for other parsers than LALR
            raise self.fail(len(self.text), "unexpected end of filter") from None
        stack = [(tree, 0)]  # the depth is checked without recursion, before anything recurses
        while stack:
            node, depth = stack.pop()
            depth += node.data in ("group", "negation")
            if depth > MAX_DEPTH:
                raise self.fail(_start(node), f"nested deeper than {MAX_DEPTH}")
            stack.extend((child, depth) for child in node.children if isinstance(child, Tree))
        return self.build(tree)

    def bad_character(self, pos: int) -> str:
        rest = self.text[pos:]
        if rest.startswith(("--", "/*", "#")):
            return "comments are not allowed"
        hints = {
            '"': "strings are single-quoted",
            "'": "unterminated string",
            "`": "unterminated or empty quoted column name",
            "|": "'|' only separates the values of key=a|b (plain names and values)",
        }
        return hints.get(rest[0], f"unexpected character {_show(rest[0])}")

    def bad_token(self, token: Token, expected: set[str]) -> InvalidArgument:
        end = token.type == "$END"
        start = len(self.text) if end else token.start_pos or 0
        what = "unexpected end of filter" if end else f"unexpected {_show(str(token))}"
        before = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", self.text[:start])
        previous = before[1].casefold() if before else ""
        if "select" in (previous, str(token).casefold()):
            return self.fail(start, f"{what}: subqueries are not allowed")
        if token.type == "LPAR" and previous and previous not in _KEYWORDS:
            return self.fail(start, f"{what}: function calls are not allowed")
        if token.type == "_NULL":
            return self.fail(start, f"{what}: NULL is only allowed in IS [NOT] NULL")
        wanted = sorted({_SAY.get(name, name.strip("_")) for name in expected})
        listed = " or ".join([", ".join(wanted[:-1]), wanted[-1]] if wanted[1:] else wanted)
        return self.fail(start, f"{what} (expected {listed})" if listed else what)

    def build(self, tree: Tree[Token]) -> _Node:
        kids = tree.children
        subtrees = [c for c in kids if isinstance(c, Tree)]
        if tree.data in ("or_expr", "and_expr"):
            return _Bool(tree.data[:-5].upper(), tuple(self.build(c) for c in subtrees))
        if tree.data in ("negation", "group"):
            inner = self.build(subtrees[0])
            return _Bool("NOT", (inner,)) if tree.data == "negation" else inner
        if tree.data == "compare":
            return self.compare(subtrees[0], str(kids[1]), subtrees[1])
        negated = any(isinstance(c, Token) and c.type == "NOT" for c in kids)
        col = self.column(_name(subtrees[0]), _start(subtrees[0]), any_type=tree.data == "is_null")
        if tree.data == "is_null":
            return _Pred(col.name, col.kind, "NULL", negated)
        if tree.data == "like":
            return self.like(
                col, negated, [c for c in kids if isinstance(c, Token) and c.type == "STRING"]
            )
        if len(subtrees) > MAX_IN_ITEMS + 1:
            raise self.fail(
                _start(subtrees[MAX_IN_ITEMS + 1]), f"more than {MAX_IN_ITEMS} items in IN"
            )
        params, keys = zip(*(self.literal(col, lit) for lit in subtrees[1:]), strict=True)
        op = "IN" if tree.data == "in_list" else "BETWEEN"
        return _Pred(col.name, col.kind, op, negated, params, keys)

    def literal(self, col: _Col, tree: Tree[Token]) -> tuple[object, object]:
        token = tree.children[0]
        assert isinstance(token, Token)
        lit = {"NUMBER": "number", "STRING": "string"}.get(token.type, token.type)
        text = _unquote(token) if lit == "string" else str(token)
        return self.value(col, lit, text, _start(token))

    def compare(self, left: Tree[Token], op: str, right: Tree[Token]) -> _Pred:
        if left.data == right.data == "literal":
            raise self.fail(_start(left), "compares two literals: one side must be a column")
        column, literal = (left, right) if left.data == "name" else (right, left)
        col = self.column(_name(column), _start(column))
        if literal.data == "name":
            raise self.fail(
                _start(literal),
                f"compares {col.about} with column {_show(_name(literal))}:"
                " the other side must be a literal ('text' is quoted)",
            )
        symbol = op if column is left else _FLIP[op]
        param, key = self.literal(col, literal)
        return _Pred(
            col.name, col.kind, "<>" if symbol == "!=" else symbol, False, (param,), (key,)
        )

    def like(self, col: _Col, negated: bool, strings: list[Token]) -> _Pred:
        if col.kind not in ("text", "binary"):
            raise self.fail(
                _start(strings[0]), f"LIKE needs a text or binary column, not {col.about}"
            )
        pattern, escape = _unquote(strings[0]), _unquote(strings[1]) if strings[1:] else "\\"
        binary = col.kind == "binary"
        if len(escape) != 1 or (binary and len(escape.encode()) != 1):
            raise self.fail(_start(strings[-1]), "ESCAPE takes one character (one byte on binary)")
        # a binary pattern matches bytes: as latin-1 text, one character is one byte
        parts = _like_parts(
            pattern.encode().decode("latin-1") if binary else pattern, escape, not binary
        )
        param = pattern.encode() if binary else pattern
        return _Pred(col.name, col.kind, "LIKE", negated, (param, escape), like=parts)


def _name(tree: Tree[Token]) -> str:
    token = tree.children[0]
    assert isinstance(token, Token)
    return token[1:-1].replace("``", "`") if token.type == "QUOTED_NAME" else str(token)


def _unquote(token: Token) -> str:
    return token[1:-1].replace("''", "'")


def _number(text: str, kind: str) -> Decimal | None:
    """The number, or None out of the column's range (or so far out that SQL would spell it
    in more digits than the filter has characters: 1e-99999999)."""
    try:
        number = Decimal(text)
    except ArithmeticError:  # an exponent of thousands of digits
        return None
    if number.is_zero():
        return Decimal(0)
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    if kind == "int":
        return number if -(2**63) <= number < 2**64 else None
    if kind == "float":
        return number if abs(number.adjusted()) < 400 and math.isfinite(float(number)) else None
    return number if len(digits) <= 65 and number.adjusted() < 65 and exponent >= -65 else None
