"""``ductor-streams outbox`` as a real subprocess against real delivery rows."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from tests.ops.helpers import append, delivery_ids, input_stream, mark_dead, mark_delivered
from tests.support.server import settings_env


def _cli(settings: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings)}
    return subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", "outbox", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def cli(settings: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_cli, settings, *args)


async def _rows(client, auth, tenant, pool) -> tuple[list[int], list[int]]:
    admin = auth(tenant=tenant)
    await input_stream(client, admin, "run-c")
    await input_stream(client, admin, "run-d")
    await append(client, admin, "run-c", ["a", "b"])
    await append(client, admin, "run-d", ["c", "d", "e"])
    c_ids = await delivery_ids(pool, tenant, "run-c", "in")
    d_ids = await delivery_ids(pool, tenant, "run-d", "in")
    await mark_delivered(pool, c_ids[:1])
    await mark_dead(pool, d_ids, "workflow 'run-d' has completed")
    return c_ids, d_ids


async def test_list_json_is_the_http_shape_with_tenant(client, auth, tenant, pool, settings):
    c_ids, d_ids = await _rows(client, auth, tenant, pool)
    done = await cli(settings, "list", "--tenant", tenant, "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["next_page"] is None
    assert [
        (d["delivery_id"], d["run_id"], d["sequence"], d["state"]) for d in body["deliveries"]
    ] == [
        (c_ids[0], "run-c", 1, "delivered"),
        (c_ids[1], "run-c", 2, "pending"),
        (d_ids[0], "run-d", 1, "dead"),
        (d_ids[1], "run-d", 2, "dead"),
        (d_ids[2], "run-d", 3, "dead"),
    ]
    assert {d["tenant"] for d in body["deliveries"]} == {tenant}
    assert body["deliveries"][2]["last_error"] == "workflow 'run-d' has completed"
    assert body["deliveries"][2]["attempts"] == 1  # the attempted one
    assert body["deliveries"][3]["attempts"] == 0

    dead = json.loads((await cli(settings, "--tenant", tenant, "--state", "dead", "--json")).stdout)
    assert [d["delivery_id"] for d in dead["deliveries"]] == d_ids
    paged = json.loads(
        (await cli(settings, "list", "--tenant", tenant, "--limit", "2", "--json")).stdout
    )
    assert [d["delivery_id"] for d in paged["deliveries"]] == c_ids
    rest = await cli(
        settings, "list", "--tenant", tenant, "--limit", "2", "--page", paged["next_page"], "--json"
    )
    assert [d["delivery_id"] for d in json.loads(rest.stdout)["deliveries"]] == d_ids[:2]
    only = await cli(
        settings, "list", "--tenant", tenant, "--run", "run-c", "--state", "pending", "--json"
    )
    assert [d["delivery_id"] for d in json.loads(only.stdout)["deliveries"]] == c_ids[1:]


async def test_list_table_is_readable(client, auth, tenant, pool, settings):
    c_ids, d_ids = await _rows(client, auth, tenant, pool)
    done = await cli(settings, "list", "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "TENANT",
        "RUN",
        "STREAM",
        "SEQ",
        "STATE",
        "ATTEMPTS",
        "AGE",
        "NEXT",
        "ERROR",
    ]
    assert set(lines[1]) <= {"-", " "}
    body = lines[2:-1]
    assert [line.split()[0] for line in body] == [str(i) for i in c_ids + d_ids]
    dead_line = body[2].split()
    assert dead_line[1:6] == [tenant, "run-d", "in", "1", "dead"]
    assert body[2].rstrip().endswith("workflow 'run-d' has completed")
    assert lines[-1] == "5 deliveries"
    # the columns line up: every row's STATE starts where the header's does
    column = lines[0].index("STATE")
    assert {line[column : column + 4] for line in body} <= {"deli", "pend", "dead"}


async def test_show_and_retry_round_trip(client, auth, tenant, pool, settings):
    _, d_ids = await _rows(client, auth, tenant, pool)
    shown = await cli(settings, "show", str(d_ids[0]), "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["state"] == "dead" and detail["record"] == {"size": 3}
    assert "payload" not in shown.stdout

    text = await cli(settings, "show", str(d_ids[0]))
    assert text.returncode == 0
    assert any(line.split() == ["state", "dead"] for line in text.stdout.splitlines())

    before = datetime.now(UTC)
    retried = await cli(settings, "retry", str(d_ids[0]), "--by", "alice", "--json")
    assert retried.returncode == 0, retried.stderr
    body = json.loads(retried.stdout)
    assert (body["state"], body["attempts"], body["retried_by"]) == ("pending", 0, "alice")
    assert datetime.fromisoformat(body["retried_at"]) >= before
    row = await pool.fetchrow(
        "SELECT state, retried_by FROM workflow_streams.input_deliveries WHERE delivery_id = $1",
        d_ids[0],
    )
    assert (row["state"], row["retried_by"]) == ("pending", "alice")

    default_by = await cli(settings, "retry", str(d_ids[1]))
    assert default_by.returncode == 0, default_by.stderr
    assert default_by.stdout.startswith(f"delivery {d_ids[1]} re-queued (dead -> pending)")
    by = await pool.fetchval(
        "SELECT retried_by FROM workflow_streams.input_deliveries WHERE delivery_id = $1",
        d_ids[1],
    )
    assert by.startswith("cli:")

    again = await cli(settings, "retry", str(d_ids[0]))
    assert again.returncode == 1
    assert "only a dead delivery can be retried" in again.stderr and again.stdout == ""


async def test_usage_errors_exit_2_and_missing_rows_exit_1(settings):
    cases = [
        (["list", "--state", "stuck"], 2, "state must be one of"),
        (["list", "--older-than", "-5"], 2, "older_than"),
        (["list", "--limit", "0"], 2, "limit"),
        (["list", "--page", "x"], 2, "page"),
        (["show"], 2, "needs a delivery ID"),
        (["retry"], 2, "needs a delivery ID"),
        (["show", "nine"], 2, "invalid int value"),
        (["list", "--by", "bob"], 2, "--by"),
        (["show", "987654321"], 1, "delivery 987654321 does not exist"),
        (["retry", "987654321"], 1, "delivery 987654321 does not exist"),
    ]
    for args, code, message in cases:
        done = await cli(settings, *args)
        assert done.returncode == code, (args, done.stderr)
        # the reason is one line, the last (argparse puts its usage before it)
        assert message in done.stderr.strip().splitlines()[-1], (args, done.stderr)
        assert done.stdout == ""


async def test_summary_and_gaps(client, auth, tenant, pool, settings):
    await _rows(client, auth, tenant, pool)
    done = await cli(settings, "summary", "--tenant", tenant, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["counts"] == {"pending": 1, "retrying": 0, "delivered": 1, "dead": 3}
    assert [(s["run_id"], s["owed"]) for s in summary["streams"]] == [("run-c", 1), ("run-d", 3)]
    text = await cli(settings, "summary", "--tenant", tenant)
    assert text.stdout.splitlines()[0] == "pending 1  retrying 0  delivered 1  dead 3"
    gaps = await cli(settings, "gaps", "--tenant", tenant)
    assert gaps.returncode == 0 and gaps.stdout.strip() == "no gaps recorded"
