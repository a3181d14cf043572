"""``doctor``'s results: one ``Check`` per guarantee, printed as a table or as JSON, and
the exit code they make."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

OK = "ok"
WARN = "warn"
FAIL = "fail"
STATUSES = (OK, WARN, FAIL)  # from best to worst


@dataclass(frozen=True)
class Check:
    """The outcome of one check: ``status`` is ``ok``, ``warn`` or ``fail``."""

    name: str
    status: str
    detail: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


def overall(checks: Sequence[Check]) -> str:
    """The worst status among ``checks`` (``ok`` when there are none)."""
    return max((c.status for c in checks), key=STATUSES.index, default=OK)


def exit_code(checks: Sequence[Check], *, strict: bool) -> int:
    """1 on any ``fail``, and with ``strict`` on any ``warn``; else 0."""
    worst = overall(checks)
    return 1 if worst == FAIL or (strict and worst == WARN) else 0


def as_json(checks: Sequence[Check]) -> str:
    """``{"status": worst, "checks": [{"name", "status", "detail"}, ...]}``."""
    return json.dumps(
        {"status": overall(checks), "checks": [asdict(c) for c in checks]}, ensure_ascii=False
    )


def as_table(checks: Sequence[Check]) -> str:
    """One line per check: name, status, detail (not wrapped: a terminal or ``less -S``
    does that), then the overall status."""
    width = max((len(c.name) for c in checks), default=5)
    lines = [f"{'check':<{width}}  status  detail"]
    lines += [f"{c.name:<{width}}  {c.status:<6}  {c.detail}" for c in checks]
    counts = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in STATUSES)
    lines.append(f"\n{overall(checks)}: {counts}")
    return "\n".join(lines)
