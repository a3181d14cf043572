"""Catch-up readers that stop reading cost bounded memory and are cut after the budget.

100 raw sockets with a 4 KiB receive buffer send a GET and never read: 40 native reads
of a 12 MB page (``limit=1000``), 40 DS catch-ups (an 8 MB page) and 20 downloads of a
12 MiB object. Each gets its response head; each connection is cut once its budget
(``DUCTOR_STREAMS_READ_STALL_SECONDS``) passes, counted by route in
``ductor_streams_read_stall_cuts_total``; the server's peak RSS rises by at most 150 MiB
over the peak that normal reads of the same bodies reached, and over the idle server's
RSS before any read, and falls back once they are cut. A reader that reads normally
gets each body whole.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.conftest import API, JWT_SECRET
from tests.support.objects import ObjectApi
from tests.support.server import ServerProcess
from tests.support.stalled import metric, open_stalled, rss_kib
from tests.temporal.polling import eventually

RECORDS = 1000
PAYLOAD = "x" * 12_000  # 1,000 of them: a 12 MB page
OBJECT_BYTES = 12 * 1024 * 1024
STALLED = {"records": 40, "ds": 40, "object": 20}
# What the stalled readers may add to the server's peak RSS (and what may stay of it once
# they are cut, over the RSS before they came).
RSS_BOUND_MIB = 150
RSS_LEFT_MIB = 25
CUTS = "ductor_streams_read_stall_cuts_total"


@pytest.fixture
def own_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    # A server of its own, so that its RSS is this test's alone; every stalled reader is
    # of one tenant, so its read slots are not what bounds them here.
    with ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        extra_env={
            "DUCTOR_STREAMS_READ_STALL_SECONDS": "2",
            "DUCTOR_STREAMS_TENANT_MAX_READS": "1000",
        },
    ) as server:
        yield server


@pytest.mark.timeout(300)
async def test_stalled_catch_up_readers_are_cut_with_bounded_memory(
    own_server: ServerProcess, tenant: str, run_id: str
) -> None:
    token = issue_token(
        JWT_SECRET,
        sub="slow",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=600,
    )
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{API}/runs/{run_id}/streams"
    assert own_server.process is not None
    pid = own_server.process.pid
    async with httpx.AsyncClient(base_url=own_server.url, timeout=120) as client:
        created = await client.post(
            base, json={"stream_id": "s", "direction": "output"}, headers=headers
        )
        assert created.status_code == 201, created.text
        batch = json.dumps({"records": [{"payload": PAYLOAD} for _ in range(RECORDS)]})
        appended = await client.post(
            f"{base}/s/records",
            content=batch,
            headers={**headers, "Content-Type": "application/json"},
        )
        assert appended.status_code == 201, appended.text
        objects = ObjectApi(client, headers, run_id)
        created = await client.post(
            base, json={"stream_id": "artifacts", "direction": "output"}, headers=headers
        )
        assert created.status_code == 201, created.text
        data = os.urandom(OBJECT_BYTES)
        object_id, _ = await objects.put_object(data)

        paths = {
            "records": f"{base}/s/records?limit={RECORDS}",
            "ds": f"{API}/runs/{run_id}/ds/v1/stream/s",
            "object": f"{base}/artifacts/objects/{object_id}/content",
        }
        rss_idle = rss_kib(pid)
        # Each body read normally first: whole, and the peak RSS that reading it costs.
        sizes = {}
        for route, path in paths.items():
            answer = await client.get(path, headers=headers)
            assert answer.status_code == 200, answer.text[:200]
            sizes[route] = len(answer.content)
        page = json.loads((await client.get(paths["records"], headers=headers)).content)
        assert [r["sequence"] for r in page["records"]] == list(range(1, RECORDS + 1))
        assert {r["payload"] for r in page["records"]} == {PAYLOAD}
        assert page["next_cursor"] == RECORDS
        assert sizes["records"] > RECORDS * len(PAYLOAD)
        assert sizes["ds"] > 8_000_000
        assert (await client.get(paths["object"], headers=headers)).content == data
        peak_before = rss_kib(pid, "VmHWM")
        rss_before = rss_kib(pid)

        stalled = {
            route: [await open_stalled(own_server.port, paths[route], token) for _ in range(n)]
            for route, n in STALLED.items()
        }
        for readers in stalled.values():
            assert [r.status for r in readers] == [200] * len(readers)
        # Nobody reads: after the 2 s budget each connection is cut, by route.
        for route, n in STALLED.items():
            await eventually(
                lambda route=route: metric(client, f'{CUTS}{{route="{route}"}}'),
                lambda cut, n=n: cut >= n,
                timeout=60,
                what=f"every stalled {route} reader cut",
            )
        peak_mib = (rss_kib(pid, "VmHWM") - peak_before) / 1024
        # And over the RSS before any read at all: what the issue's readers may cost.
        peak_over_idle_mib = (rss_kib(pid, "VmHWM") - rss_idle) / 1024
        for route, n in STALLED.items():
            assert await metric(client, f'{CUTS}{{route="{route}"}}') == n
            # Each connection ends (what the kernel had buffered is read first), short
            # of its body.
            received = await asyncio.gather(*(r.drain_to_end() for r in stalled[route]))
            assert max(received) < sizes[route], route
            for reader in stalled[route]:
                reader.close()
        rss_after = await eventually(
            lambda: _rss(pid),
            lambda rss: rss - rss_before < RSS_LEFT_MIB * 1024,
            timeout=30,
            what="the server's RSS back",
        )
        print(
            f"peak RSS +{peak_mib:.0f} MiB over normal reads, +{peak_over_idle_mib:.0f} MiB "
            f"over the idle server ({rss_idle // 1024} MiB); RSS {rss_before // 1024} MiB "
            f"before the stalled readers, {rss_after // 1024} MiB after"
        )
        assert peak_mib < RSS_BOUND_MIB
        assert peak_over_idle_mib < RSS_BOUND_MIB

        # The server serves on: each body whole again.
        for route, path in paths.items():
            answer = await client.get(path, headers=headers)
            assert answer.status_code == 200
            assert len(answer.content) == sizes[route], route


async def _rss(pid: int) -> int:
    return rss_kib(pid)
