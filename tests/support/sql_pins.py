"""Whether a SQL statement reaches one stream only: every distributed table it reads or
writes is pinned to one value of the distribution column (``stream_pk``).

A small reader of this project's own SQL, not a general parser: it knows the shapes the
named blocks (ductor_streams/schema/sql/*.sql) and the PL/pgSQL functions of
schema/schema.sql are written in, which is enough to tell, for each reference to a
table, whether its ``stream_pk`` is tied by equalities to the pinned value (a parameter
such as ``$1``, or a function argument such as ``p_stream_pk``), the way Citus's router
planner decides that a query stays on one shard:

- each parenthesised query (``(SELECT ...)``, a CTE's body, ``EXISTS (...)``) is a scope;
  an alias is looked up from the scope it is used in outwards (correlated subqueries);
- ``a.stream_pk = b.stream_pk`` and ``a.stream_pk = $1`` join classes; a CTE or derived
  table whose select (or RETURNING) list yields ``x.stream_pk`` is pinned when ``x`` is;
- an ``INSERT`` is pinned by the value it gives the ``stream_pk`` column;
- an unqualified ``stream_pk`` belongs to the scope's only table (or CTE) reference;
- ``stream_pk = ANY(...)`` pins nothing (several streams: several shards);
- a call of a function of the schema passes its first argument as that function's
  stream, so it must be pinned, and the function must be one that pins it.

What it cannot see it reports as unpinned, so a mistake here fails a test rather than
passing one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SCHEMA = "workflow_streams"
DISTRIBUTION_COLUMN = "stream_pk"

# Words that can follow a table name where an alias would stand.
_NOT_ALIASES = {
    "WHERE", "SET", "ON", "USING", "JOIN", "LEFT", "RIGHT", "INNER", "CROSS", "FULL",
    "ORDER", "GROUP", "LIMIT", "RETURNING", "FOR", "VALUES", "SELECT", "DEFAULT", "WITH",
    "UNION", "HAVING", "OFFSET", "WINDOW", "NATURAL", "LATERAL", "FROM", "INTO", "AND",
    "OR", "NOT", "IS", "AS", "THEN", "LOOP", "END", "ELSE", "WHEN", "EXCEPT", "INTERSECT",
    "MATERIALIZED", "ASC", "DESC", "NULLS",
}  # fmt: skip
# An alias after a table or subquery: never a keyword (which would swallow the next clause).
_ALIAS = r"(?:\s+(?:AS\s+)?(?!(?:" + "|".join(sorted(_NOT_ALIASES)) + r")\b)([a-z_]\w*))?"
_QUERY_START = re.compile(r"\s*(SELECT|WITH|UPDATE|INSERT|DELETE)\b", re.IGNORECASE)
_CAST = re.compile(r"::\s*[a-z_][a-z0-9_]*(\s+precision)?(\s*\[\])?", re.IGNORECASE)
_TERM = r"(?:\$\d+|[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?)"
_EQUALITY = re.compile(rf"(?<![<>!=])({_TERM})\s*=\s*({_TERM})(?!\s*\()", re.IGNORECASE)


def strip_sql(sql: str) -> str:
    """The statement without comments, string literals emptied (``''``), one line."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            i = sql.find("\n", i)
            i = n if i < 0 else i
        elif ch == "'":
            escaped = i > 0 and sql[i - 1] in "Ee" and (i < 2 or not sql[i - 2].isalnum())
            j = i + 1
            while j < n:
                if escaped and sql[j] == "\\":
                    j += 2
                    continue
                if sql[j] == "'":
                    if j + 1 < n and sql[j + 1] == "'":
                        j += 2
                        continue
                    break
                j += 1
            out.append("''")
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return _CAST.sub("", " ".join("".join(out).split()))


def _matching_parens(text: str) -> dict[int, int]:
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            pairs[stack.pop()] = i
    if stack:
        raise ValueError(f"unbalanced parentheses in: {text[:200]}")
    return pairs


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """``text`` split at ``separator`` outside parentheses and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


@dataclass
class _Scope:
    id: int
    parent: int | None
    text: str = ""
    # alias -> ("table", name) | ("cte", scope id) | ("derived", scope id)
    refs: dict[str, tuple[str, object]] = field(default_factory=dict)
    ctes: dict[str, int] = field(default_factory=dict)
    table_refs: list[tuple[str, str]] = field(default_factory=list)  # (table, alias)


@dataclass(frozen=True)
class Problem:
    """Why a statement is not pinned to one stream."""

    what: str

    def __str__(self) -> str:
        return self.what


class _Analysis:
    def __init__(
        self,
        sql: str,
        pins: set[str],
        distributed: set[str],
        pinned_functions: set[str],
        table_free_functions: set[str],
    ) -> None:
        self.pins = {p.lower() for p in pins}
        self.distributed = distributed
        self.pinned_functions = pinned_functions
        self.table_free_functions = table_free_functions
        self.scopes: list[_Scope] = []
        self.parent: dict[object, object] = {}
        self.problems: list[Problem] = []
        self.inserts: list[tuple[int, str, str, str | None]] = []  # scope, table, alias, value
        self.calls: list[tuple[int, str, str]] = []  # scope, function, first argument
        text = strip_sql(sql)
        self._build(text, None)
        for scope in self.scopes:
            self._collect(scope)
        for scope in self.scopes:
            self._link(scope)
        self._judge()

    # -- scopes -------------------------------------------------------------------------

    def _build(self, text: str, parent: int | None) -> int:
        scope = _Scope(len(self.scopes), parent)
        self.scopes.append(scope)
        scope.text = self._flatten(text, scope.id)
        return scope.id

    def _flatten(self, text: str, scope_id: int) -> str:
        pairs = _matching_parens(text)
        out: list[str] = []
        i = 0
        while i < len(text):
            if text[i] == "(":
                j = pairs[i]
                inner = text[i + 1 : j]
                if _QUERY_START.match(inner):
                    child = self._build(inner, scope_id)
                    out.append(f"(§{child})")
                else:
                    out.append("(" + self._flatten(inner, scope_id) + ")")
                i = j + 1
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def _collect(self, scope: _Scope) -> None:
        text = scope.text
        for m in re.finditer(
            r"\b([a-z_]\w*)\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(§(\d+)\)", text, re.I
        ):
            scope.ctes[m.group(1).lower()] = int(m.group(2))
        table = re.compile(
            rf"(?:\bFROM|\bJOIN|\bUPDATE|\bINTO|\bUSING|,)\s+(?:ONLY\s+)?{SCHEMA}\.(\w+)\b"
            r"(?![.%(])" + _ALIAS,
            re.I,
        )
        for m in table.finditer(text):
            name = m.group(1).lower()
            alias = (m.group(2) or "").lower()
            if not alias or alias.upper() in _NOT_ALIASES:
                alias = name
            if not m.group(0).upper().startswith("INTO"):
                # An INSERT's target is pinned by the value it is given, and is no
                # source that an unqualified column of its SELECT could mean.
                scope.refs[alias] = ("table", name)
            scope.table_refs.append((name, alias))
        for m in re.finditer(
            r"(?:\bFROM|\bJOIN|\bUSING|,)\s+(?:LATERAL\s+)?\(§(\d+)\)" + _ALIAS,
            text,
            re.I,
        ):
            if m.group(2):
                scope.refs[m.group(2).lower()] = ("derived", int(m.group(1)))
        for m in re.finditer(
            r"(?:\bFROM|\bJOIN|\bUSING|,)\s+(?:LATERAL\s+)?([a-z_]\w*)\b(?![.(])" + _ALIAS,
            text,
            re.I,
        ):
            cte = self._cte(scope.id, m.group(1).lower())
            if cte is None or re.match(
                r"\s+AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(§", text[m.end(1) :], re.I
            ):
                continue  # not a reference: the CTE's own definition
            alias = (m.group(2) or "").lower()
            if not alias or alias.upper() in _NOT_ALIASES:
                alias = m.group(1).lower()
            scope.refs[alias] = ("cte", cte)
        insert = re.compile(
            rf"\bINSERT\s+INTO\s+{SCHEMA}\.(\w+)(?:\s+(?:AS\s+)?([a-z_]\w*))?\s*\(([^()]*)\)\s*"
            r"(VALUES\s*\(|SELECT\b)",
            re.I,
        )
        for m in insert.finditer(text):
            name = m.group(1).lower()
            alias = (m.group(2) or name).lower()
            columns = [c.strip().lower() for c in m.group(3).split(",")]
            if m.group(4).upper().startswith("VALUES"):
                start = m.end() - 1
                values = split_top_level(text[start + 1 : _matching_parens(text)[start]])
            else:
                values = _select_list(text[m.start(4) :])
            value = None
            if DISTRIBUTION_COLUMN in columns and columns.index(DISTRIBUTION_COLUMN) < len(values):
                value = values[columns.index(DISTRIBUTION_COLUMN)]
            self.inserts.append((scope.id, name, alias, value))
        for m in re.finditer(rf"\b{SCHEMA}\.(\w+)\s*\(", text, re.I):
            if re.search(r"\bINTO\s+$", text[: m.start()], re.I):
                continue  # INSERT INTO table (columns): not a call
            start = m.end() - 1
            args = split_top_level(text[start + 1 : _matching_parens(text)[start]])
            self.calls.append((scope.id, m.group(1).lower(), args[0] if args else ""))

    def _cte(self, scope_id: int | None, name: str) -> int | None:
        while scope_id is not None:
            scope = self.scopes[scope_id]
            if name in scope.ctes:
                return scope.ctes[name]
            scope_id = scope.parent
        return None

    # -- terms and classes --------------------------------------------------------------

    def _node(self, scope_id: int, term: str) -> object | None:
        """The class node of a term as written in a scope (None: not about streams)."""
        term = term.strip().lower()
        if term in self.pins:
            return "PIN"
        if term.startswith("$") or term.startswith("p_"):
            return ("param", term)
        if "." in term:
            alias, column = term.split(".", 1)
        else:
            alias, column = None, term
        if column != DISTRIBUTION_COLUMN:
            return None
        found = self._resolve(scope_id, alias)
        return found if found is not None else ("unresolved", scope_id, term)

    def _resolve(self, scope_id: int | None, alias: str | None) -> object | None:
        while scope_id is not None:
            scope = self.scopes[scope_id]
            if alias is None:
                if len(scope.refs) == 1:
                    return ("col", scope_id, next(iter(scope.refs)))
                if len(scope.refs) > 1:
                    return None  # ambiguous: left unpinned
            elif alias in scope.refs:
                return ("col", scope_id, alias)
            scope_id = scope.parent
        return None

    def _find(self, node: object) -> object:
        while self.parent.get(node, node) != node:
            node = self.parent[node]
        return node

    def _union(self, a: object | None, b: object | None) -> None:
        if a is None or b is None:
            return
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[ra] = rb

    def _link(self, scope: _Scope) -> None:
        for m in _EQUALITY.finditer(scope.text):
            left, right = m.group(1), m.group(2)
            if right.upper() in {"ANY", "ALL", "SOME"}:
                continue
            a, b = self._node(scope.id, left), self._node(scope.id, right)
            if a is None and b is None:
                continue
            if a is None or b is None:
                continue  # a stream column equal to something else pins nothing
            self._union(a, b)
        for alias, (kind, target) in scope.refs.items():
            if kind in ("cte", "derived"):
                assert isinstance(target, int)
                output = self._output(target)
                if output is not None:
                    self._union(("col", scope.id, alias), self._node(target, output))
        for scope_id, _table, alias, value in self.inserts:
            if scope_id == scope.id and value is not None:
                self._union(("col", scope_id, alias), self._node(scope_id, value))

    def _output(self, scope_id: int) -> str | None:
        """The expression a CTE or derived table yields as its stream_pk column."""
        text = self.scopes[scope_id].text
        returning = re.search(r"\bRETURNING\b(.*)$", text, re.I)
        items = split_top_level(returning.group(1)) if returning else _select_list(text)
        for item in items:
            named = re.match(r"(.+?)\s+AS\s+(\w+)$", item, re.I)
            expression, name = (named.group(1), named.group(2)) if named else (item, item)
            if name.lower().split(".")[-1] == DISTRIBUTION_COLUMN:
                return expression
        return None

    # -- the verdict --------------------------------------------------------------------

    def _judge(self) -> None:
        pin = self._find("PIN")
        for scope in self.scopes:
            for table, alias in scope.table_refs:
                if table not in self.distributed:
                    continue
                if self._find(("col", scope.id, alias)) != pin:
                    self.problems.append(Problem(f"{table} {alias}: stream_pk not pinned"))
        for scope_id, function, first in self.calls:
            if function in self.table_free_functions:
                continue
            if function not in self.pinned_functions:
                self.problems.append(Problem(f"calls {function}, which is not one stream's"))
            elif self._find(self._node(scope_id, first) or ("none",)) != pin:
                self.problems.append(Problem(f"calls {function} with {first!r}, not pinned"))

    def distributed_refs(self) -> list[str]:
        return [
            t for scope in self.scopes for t, _ in scope.table_refs if t in self.distributed
        ] + [f for _, f, _ in self.calls if f not in self.table_free_functions]


def _select_list(text: str) -> list[str]:
    """The items between the first SELECT and the FROM (or end) at the same depth."""
    m = re.search(r"\bSELECT\b(?:\s+DISTINCT\b)?", text, re.I)
    if m is None:
        return []
    rest = text[m.end() :]
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and re.match(r"\s(FROM|INTO|WHERE|ORDER|LIMIT)\b", rest[i:], re.I):
            rest = rest[:i]
            break
    return split_top_level(rest)


def unpinned(
    sql: str,
    pins: set[str],
    *,
    distributed: set[str],
    pinned_functions: set[str],
    table_free_functions: set[str],
) -> list[Problem]:
    """Every reason ``sql`` may reach more than the stream named by ``pins``."""
    return _Analysis(sql, pins, distributed, pinned_functions, table_free_functions).problems


def touches(sql: str, *, distributed: set[str], table_free_functions: set[str]) -> list[str]:
    """The distributed tables and schema functions ``sql`` refers to."""
    return _Analysis(sql, set(), distributed, set(), table_free_functions).distributed_refs()


@dataclass(frozen=True)
class Function:
    """One function of schema.sql: name, argument names, body."""

    name: str
    arguments: tuple[str, ...]
    body: str

    @property
    def signature(self) -> str:
        return f"{self.name}/{len(self.arguments)}"


def schema_functions(schema_sql: str) -> list[Function]:
    """The functions of the schema file, each overload on its own."""
    pattern = re.compile(
        rf"CREATE OR REPLACE FUNCTION {SCHEMA}\.(\w+)\((.*?)\)\n"
        r".*?AS \$function\$(.*?)\$function\$",
        re.S,
    )
    found = []
    for m in pattern.finditer(schema_sql):
        arguments = tuple(a.split()[0] for a in m.group(2).split(",") if a.strip())
        found.append(Function(m.group(1), arguments, m.group(3)))
    return found


def function_statements(body: str) -> list[str]:
    """A function body's statements (split at semicolons outside parentheses)."""
    text = body
    declare = re.search(r"\bBEGIN\b", text)
    if declare is not None and re.match(r"\s*DECLARE\b", text):
        text = text[declare.end() :]
    return [s for s in split_top_level(strip_sql(text), ";") if s]
