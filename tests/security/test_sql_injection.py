"""No SQL is built from strings at run time: every query is a constant (the named blocks
of schema/sql, or a constant in the migration runner) with ``$n`` parameters, so no
request value can become SQL. Path IDs with SQL metacharacters are exercised against
the real server in test_bad_input.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ductor_streams"
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|DROP|ALTER)\b\s", re.IGNORECASE)
DB_CALLS = {"execute", "executemany", "fetch", "fetchrow", "fetchval", "cursor", "prepare"}


def _text_parts(node: ast.JoinedStr) -> str:
    return "".join(v.value for v in node.values if isinstance(v, ast.Constant))


def test_no_f_string_or_concatenated_sql() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and SQL.search(_text_parts(node)):
                offenders.append(f"{path.name}:{node.lineno}: f-string SQL")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in DB_CALLS:
                if node.args and not isinstance(node.args[0], ast.Constant | ast.Subscript):
                    first = node.args[0]
                    if isinstance(first, ast.JoinedStr | ast.BinOp) or (
                        isinstance(first, ast.Call) and getattr(first.func, "attr", "") == "format"
                    ):
                        offenders.append(f"{path.name}:{node.lineno}: SQL built at run time")
    assert not offenders, "\n".join(offenders)
