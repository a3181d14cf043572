"""Loads the named SQL blocks of ``schema/sql/*.sql`` (``-- name: <name>`` headers).

One file per area (streams, delivery, objects, ...); names are unique across files, so
runtime code asks for ``QUERIES["<entity>_<verb>"]`` and never holds SQL of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

SQL_DIR = Path(__file__).with_name("sql")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(paths: list[Path]) -> dict[str, str]:
    """Return ``{name: sql}`` for every named block in the files."""
    queries: dict[str, str] = {}
    for path in paths:
        parts = _NAME.split(path.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice (again in {path.name})")
            queries[name] = body.strip()
    return queries


class _Queries(dict[str, str]):
    """A dict whose missing keys fail loudly with the query name."""

    def __missing__(self, key: str) -> str:
        raise KeyError(f"no SQL block named {key!r} in {SQL_DIR}")


QUERIES: dict[str, str] = _Queries(load_queries(sorted(SQL_DIR.glob("*.sql"))))
