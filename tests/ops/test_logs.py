"""Operator actions leave structured JSON log lines with stream and run IDs, never
payloads or tokens (the real server subprocess's log)."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx

from tests.ops.helpers import OPS, append, delivery_ids, input_stream, mark_dead
from tests.temporal.polling import eventually


async def test_retry_is_logged_as_json_with_ids_and_no_payload(server, auth, tenant, pool):
    marker = f"secret-{secrets.token_hex(6)}"
    run_id = f"run-log-{secrets.token_hex(4)}"
    admin = auth(tenant=tenant)
    ops = auth(tenant=tenant, scopes=["streams:ops"], sub="oncall-log")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await input_stream(http, admin, run_id)
        await append(http, admin, run_id, [{"text": marker}])
        (delivery,) = await delivery_ids(pool, tenant, run_id, "in")
        await mark_dead(pool, [delivery], "gone")
        r = await http.post(f"{OPS}/deliveries/{delivery}/retry", headers=ops)
        assert r.status_code == 200, r.text

    def lines() -> list[dict[str, Any]]:
        found = []
        for line in server.log_path.read_text(encoding="utf-8").splitlines():
            if run_id in line:
                found.append(json.loads(line))  # every line of ours is one JSON object
        return found

    async def probe() -> list[dict[str, Any]]:
        return lines()

    (entry,) = await eventually(probe, lambda found: len(found) == 1, what="the retry log line")
    assert entry["message"] == "dead delivery re-queued by an operator"
    assert entry["level"] == "INFO"
    assert (entry["run_id"], entry["stream_id"], entry["tenant"]) == (run_id, "in", tenant)
    assert (entry["delivery_id"], entry["sequence"]) == (delivery, 1)
    assert entry["retried_by"] == "oncall-log"
    text = server.log_path.read_text(encoding="utf-8")
    assert marker not in text
    assert ops["Authorization"].removeprefix("Bearer ") not in text
