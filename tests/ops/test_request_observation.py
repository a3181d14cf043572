"""Every HTTP request is observed (http/middleware/observe.py): counted by route template and status
in /metrics, logged as JSON (uvicorn's access lines included) with the request ID the
response echoes, in problem bodies too. A real `serve` subprocess of its own, so that
the counts are exact."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ductor_streams.config import Settings
from tests.conftest import API, TokenFactory, unique
from tests.support.server import ServerProcess
from tests.temporal.polling import eventually

RECORDS = API + "/runs/{run_id}/streams/{stream_id}/records"
STREAMS = API + "/runs/{run_id}/streams"
UTC_MILLIS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def observed_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"DUCTOR_STREAMS_ACCESS_LOG": "true"}
    with ServerProcess(settings, extra_env=env, log_path=tmp_path / "serve.log") as server:
        yield server


def _request_counts(text: str) -> dict[tuple[str, str, str], float]:
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ductor_streams_http_request_duration_seconds_count":
                labels = sample.labels
                counts[(labels["method"], labels["route"], labels["status"])] = sample.value
    return counts


async def test_request_metrics_count_by_route_template_and_status(
    observed_server: ServerProcess, auth: TokenFactory, run_id: str
) -> None:
    stream = unique()
    async with httpx.AsyncClient(base_url=observed_server.url, headers=auth(), timeout=10) as http:
        created = await http.post(
            f"{API}/runs/{run_id}/streams",
            json={
                "stream_id": stream,
                "direction": "output",
                "consumers": ["ui"],
                "credit": {"max_unread_items": 2},
            },
        )
        assert created.status_code == 201, created.text
        records = f"{API}/runs/{run_id}/streams/{stream}/records"
        for _ in range(2):
            r = await http.post(records, json={"records": [{"payload": 1}]})
            assert r.status_code == 201, r.text
        over = await http.post(records, json={"records": [{"payload": 1}]})
        assert over.status_code == 429
        missing = await http.post(
            f"{API}/runs/{run_id}/streams/nope/records", json={"records": [{"payload": 1}]}
        )
        assert missing.status_code == 404
        unknown = await http.get(f"{API}/no/such/{run_id}")
        assert unknown.status_code == 404
        text = (await http.get("/metrics")).text
    counts = _request_counts(text)
    assert counts[("POST", STREAMS, "201")] == 1
    assert counts[("POST", RECORDS, "201")] == 2
    assert counts[("POST", RECORDS, "429")] == 1
    assert counts[("POST", RECORDS, "404")] == 1
    assert counts[("GET", "unmatched", "404")] == 1
    # Never the raw path: no run or stream id in any label.
    assert run_id not in text and stream not in text
    for name in (
        "ductor_streams_append_statement_seconds_count",
        "ductor_streams_append_group_requests_count",
        "ductor_streams_db_pool_connections",
        "ductor_streams_db_pool_waiting",
        "ductor_streams_sse_events_written_total",
        "ductor_streams_sse_backfill_records_count",
        "ductor_streams_follower_lag_seconds_count",
        "ductor_streams_delivery_claim_seconds_count",
        "ductor_streams_delivery_signal_seconds_count",
    ):
        assert re.search(rf"^{name}[{{ ]", text, re.M), name
    statements = re.search(r"^ductor_streams_append_statement_seconds_count (\S+)$", text, re.M)
    assert statements is not None and float(statements.group(1)) >= 2
    assert re.search(
        r'^ductor_streams_db_pool_connections\{pool="serve",state="max"\} 10', text, re.M
    )


async def test_log_lines_are_json_with_the_echoed_request_id(
    observed_server: ServerProcess, auth: TokenFactory, run_id: str
) -> None:
    stream = unique()
    async with httpx.AsyncClient(base_url=observed_server.url, headers=auth(), timeout=10) as http:
        created = await http.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": stream, "direction": "output"},
            headers={"X-Request-ID": "client-chose-this-1"},
        )
        assert created.status_code == 201
        assert created.headers["x-request-id"] == "client-chose-this-1"
        secret = f"payload-{unique()}"
        appended = await http.post(
            f"{API}/runs/{run_id}/streams/{stream}/records",
            json={"records": [{"payload": secret}]},
            headers={"X-Request-ID": "client-chose-this-2"},
        )
        assert appended.headers["x-request-id"] == "client-chose-this-2"
        missing = await http.post(
            f"{API}/runs/{run_id}/streams/nope/records", json={"records": [{"payload": secret}]}
        )
        assert missing.status_code == 404
        generated = missing.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{16}", generated)
        assert missing.json()["request_id"] == generated
        # A header that is no usable ID (too long) is replaced, not echoed.
        long = await http.get(f"{API}/no/such", headers={"X-Request-ID": "x" * 200})
        assert long.status_code == 404 and len(long.headers["x-request-id"]) == 16
        assert long.json()["request_id"] == long.headers["x-request-id"]

    assert observed_server.log_path is not None
    log_path = observed_server.log_path

    def access_lines() -> list[dict[str, Any]]:
        entries = [json.loads(line) for line in log_path.read_text().splitlines()]
        return [e for e in entries if e["logger"] == "uvicorn.access"]

    async def probe() -> list[dict[str, Any]]:
        return await asyncio.to_thread(access_lines)

    lines = await eventually(probe, lambda found: len(found) >= 4, what="the access lines")
    by_id = {line.get("request_id"): line for line in lines}
    for request_id in ("client-chose-this-1", "client-chose-this-2", generated):
        line = by_id[request_id]
        assert UTC_MILLIS.match(line["time"]), line
        assert line["level"] == "INFO"
    assert " 404" in by_id[generated]["message"]
    text = await asyncio.to_thread(log_path.read_text)
    entries = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert {"uvicorn.error", "uvicorn.access"} <= {e["logger"] for e in entries}
    assert all(UTC_MILLIS.match(e["time"]) for e in entries)
    assert secret not in text  # still no payload in any log
