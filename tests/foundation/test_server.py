"""A real server process: health, OpenAPI, problems for unknown routes, and durability of
every 2xx append across a SIGKILL."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import API
from tests.support.server import ServerProcess


async def test_health_ready_and_openapi(server):
    async with httpx.AsyncClient(base_url=server.url) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        assert (await c.get("/readyz")).json() == {"status": "ready"}
        spec = (await c.get("/schema/openapi.json")).json()
        assert any(path.startswith(API) for path in spec["paths"])


async def test_unknown_route_and_method_are_problems(server, auth, run_id):
    async with httpx.AsyncClient(base_url=server.url) as c:
        r = await c.get("/no/such/route")
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert r.headers["content-type"].startswith("application/problem+json")
        r = await c.delete(f"{API}/runs/{run_id}/streams/s", headers=auth())
        assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


async def test_every_acknowledged_append_survives_sigkill(settings, auth, run_id):
    """Invariant 5: a record whose append got a 2xx is there after a crash."""
    h = auth()
    acknowledged: list[int] = []
    enough = asyncio.Event()
    proc = ServerProcess(settings).start()
    try:
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as c:
            url = f"{API}/runs/{run_id}/streams"
            assert (
                await c.post(url, json={"stream_id": "s", "direction": "output"}, headers=h)
            ).status_code == 201

            async def writer(w: int) -> None:
                for i in range(10_000):
                    try:
                        r = await c.post(
                            f"{url}/s/records", json={"records": [{"payload": [w, i]}]}, headers=h
                        )
                    except httpx.HTTPError:
                        return
                    if r.status_code != 201:
                        return
                    acknowledged.append(r.json()["first_sequence"])
                    if len(acknowledged) >= 200:
                        enough.set()

            writers = [asyncio.create_task(writer(w)) for w in range(4)]
            await asyncio.wait_for(enough.wait(), timeout=30)
            proc.kill()
            await asyncio.gather(*writers)
    finally:
        proc.kill()
    assert len(acknowledged) >= 200
    with ServerProcess(settings) as again:
        async with httpx.AsyncClient(base_url=again.url) as c:
            seen: list[int] = []
            cursor = 0
            while True:
                page = (
                    await c.get(
                        f"{API}/runs/{run_id}/streams/s/records",
                        params={"cursor": cursor, "limit": 1000},
                        headers=h,
                    )
                ).json()
                if not page["records"]:
                    break
                seen.extend(r["sequence"] for r in page["records"])
                cursor = page["next_cursor"]
    assert set(acknowledged) <= set(seen)
    assert seen == list(range(1, len(seen) + 1))
