"""``ductor-streams outbox``: the operator view of input delivery, on the database host.

The CLI talks to Postgres directly (``DUCTOR_STREAMS_DATABASE_URL``), so it sees every
tenant unless ``--tenant`` narrows it, and it never prints payloads (a person with the
database URL can read them with SQL; this tool is for repairing delivery, not reading
data). ``--json`` prints what the HTTP endpoints answer, plus each row's ``tenant``.

Exit codes: 0 ok; 2 bad usage (a bad filter, a missing ID); 1 anything else (no such
delivery, not dead, database unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import asyncpg

from ductor_streams import ops
from ductor_streams.config import ConfigError, Settings
from ductor_streams.errors import StreamsError
from ductor_streams.ops import filters
from ductor_streams.store.db import create_pool

MAX_ERROR_WIDTH = 60


def run_outbox(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run one ``outbox`` action; returns the exit code."""
    dsn = settings.require_database()
    if args.action in ("show", "retry") and args.delivery_id is None:
        raise ConfigError(f"`outbox {args.action}` needs a delivery ID")
    if args.action in ("list", "summary", "gaps", "show") and args.by is not None:
        raise ConfigError("--by is only for `outbox retry`")
    try:
        return asyncio.run(_run(dsn, args, out, settings.database_pooler))
    except StreamsError as exc:
        print(f"ductor-streams: {exc.detail}", file=sys.stderr)
        return 2 if exc.status == 400 else 1
    except asyncpg.UndefinedTableError:
        print(
            "ductor-streams: the schema is missing: run `ductor-streams migrate`", file=sys.stderr
        )
        return 1
    except asyncpg.PostgresError as exc:
        print(f"ductor-streams: database error ({type(exc).__name__})", file=sys.stderr)
        return 1
    except (OSError, asyncpg.InterfaceError, asyncpg.exceptions.InternalClientError) as exc:
        reason = type(exc).__name__
        print(f"ductor-streams: the database is unreachable ({reason})", file=sys.stderr)
        return 1


async def _run(dsn: str, args: argparse.Namespace, out: TextIO, pooler: str = "session") -> int:
    view = ops.Visibility(args.tenant, None)
    pool = await create_pool(dsn, min_size=1, max_size=2, pooler=pooler)
    try:
        if args.action == "list":
            where = ops.DeliveryFilter(
                state=filters.parse_state(args.state),
                run_id=filters.parse_run(args.run),
                stream_id=filters.parse_stream(args.stream),
                older_than_seconds=filters.parse_age(args.older_than),
            )
            page = await ops.list_deliveries(
                pool,
                view,
                where,
                limit=filters.parse_limit(args.limit),
                after=filters.parse_page(args.page),
            )
            _print_list(page, args.json, out)
        elif args.action == "show":
            detail = await ops.get_delivery(pool, view, args.delivery_id)
            _print_one(detail.delivery, args.json, out, record_size=detail.record_size)
        elif args.action == "retry":
            by = args.by or f"cli:{getpass.getuser()}@{socket.gethostname()}"
            delivery = await ops.retry_delivery(pool, view, args.delivery_id, retried_by=by)
            if not args.json:
                print(f"delivery {delivery.delivery_id} re-queued (dead -> pending)", file=out)
            _print_one(delivery, args.json, out)
        elif args.action == "summary":
            summary = await ops.summarize(
                pool, view, max_streams=filters.parse_limit(args.limit or filters.MAX_LIMIT)
            )
            _print_summary(summary, args.json, out)
        elif args.action == "gaps":
            gaps = await ops.list_gaps(
                pool,
                view,
                ops.GapFilter(filters.parse_run(args.run), filters.parse_stream(args.stream)),
                limit=filters.parse_limit(args.limit),
                before=filters.parse_page(args.page),
            )
            _print_gaps(gaps, args.json, out)
        return 0
    finally:
        await pool.close()


# --- output ---------------------------------------------------------------------------


def _dump(value: Any, out: TextIO) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False), file=out)


def _with_tenant(delivery: ops.Delivery) -> dict[str, Any]:
    return {"tenant": delivery.tenant, **delivery.to_json_dict()}


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """``3m12s``-style time since ``moment`` (negative: ``in ...``)."""
    if moment is None:
        return "-"
    seconds = ((now or datetime.now(UTC)) - moment).total_seconds()
    text = _duration(abs(seconds))
    return text if seconds >= 0 else f"in {text}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table: left-aligned columns, numbers right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    numeric = [
        bool(rows) and all(r[i].isdigit() or r[i] == "-" for r in rows) for i in range(len(headers))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(w) if num else cell.ljust(w)
            for cell, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _clip(text: str | None, width: int = MAX_ERROR_WIDTH) -> str:
    if not text:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _print_list(page: ops.DeliveryPage, as_json: bool, out: TextIO) -> None:
    if as_json:
        _dump(
            {"deliveries": [_with_tenant(d) for d in page.deliveries], "next_page": page.next_page},
            out,
        )
        return
    if not page.deliveries:
        print("no deliveries match", file=out)
        return
    now = datetime.now(UTC)
    rows = [
        [
            str(d.delivery_id),
            d.tenant,
            d.run_id,
            d.stream_id,
            str(d.sequence),
            d.state,
            str(d.attempts),
            age(d.created_at, now),
            age(d.next_attempt_at, now) if d.state in ("pending", "retrying") else "-",
            _clip(d.last_error),
        ]
        for d in page.deliveries
    ]
    headers = ["ID", "TENANT", "RUN", "STREAM", "SEQ", "STATE", "ATTEMPTS", "AGE", "NEXT", "ERROR"]
    print(table(headers, rows), file=out)
    tail = f"{len(page.deliveries)} deliveries"
    if page.next_page:
        tail += f"; more with --page {page.next_page}"
    print(tail, file=out)


def _print_one(
    delivery: ops.Delivery, as_json: bool, out: TextIO, *, record_size: int | None = None
) -> None:
    if as_json:
        body = _with_tenant(delivery)
        if record_size is not None:
            body["record"] = {"size": record_size}
        _dump(body, out)
        return
    fields = _with_tenant(delivery)
    if record_size is not None:
        fields["record_size"] = record_size
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        print(f"{key.ljust(width)}  {'-' if value is None else value}", file=out)


def _print_summary(summary: ops.DeliverySummary, as_json: bool, out: TextIO) -> None:
    if as_json:
        _dump(summary.to_json_dict(), out)
        return
    counts = "  ".join(f"{state} {summary.counts[state]}" for state in ops.DELIVERY_STATES)
    print(counts, file=out)
    oldest = summary.oldest_pending_age_seconds
    print(f"oldest owed: {'-' if oldest is None else _duration(oldest)}", file=out)
    if not summary.streams:
        print("every input record has reached its workflow", file=out)
        return
    rows = [
        [
            s.run_id,
            s.stream_id,
            str(s.owed),
            str(s.pending),
            str(s.retrying),
            str(s.dead),
            str(s.first_undelivered_sequence),
            str(s.latest_sequence),
            _duration(s.lag_seconds),
        ]
        for s in summary.streams
    ]
    headers = ["RUN", "STREAM", "OWED", "PENDING", "RETRYING", "DEAD", "FIRST", "LATEST", "WAITING"]
    print(table(headers, rows), file=out)


def _print_gaps(page: ops.GapPage, as_json: bool, out: TextIO) -> None:
    if as_json:
        _dump(page.to_json_dict(), out)
        return
    if not page.gaps:
        print("no gaps recorded", file=out)
        return
    now = datetime.now(UTC)
    rows = [
        [
            str(g.gap_id),
            g.run_id,
            g.stream_id,
            str(g.expected_sequence),
            str(g.received_sequence),
            str(g.repaired_records),
            g.detected_by,
            age(g.detected_at, now),
        ]
        for g in page.gaps
    ]
    headers = ["ID", "RUN", "STREAM", "EXPECTED", "RECEIVED", "REPAIRED", "BY", "AGE"]
    print(table(headers, rows), file=out)
    if page.next_page:
        print(f"more with --page {page.next_page}", file=out)
