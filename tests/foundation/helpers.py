"""Small HTTP helpers for foundation tests."""

from __future__ import annotations

from typing import Any

from tests.conftest import API


def stream_url(run_id: str, stream_id: str = "", suffix: str = "") -> str:
    base = f"{API}/runs/{run_id}/streams"
    if stream_id:
        base += f"/{stream_id}"
    return base + suffix


async def create(client: Any, headers: dict[str, str], run_id: str, **body: Any) -> dict[str, Any]:
    body.setdefault("stream_id", "s")
    body.setdefault("direction", "output")
    r = await client.post(stream_url(run_id), json=body, headers=headers)
    assert r.status_code == 201, r.text
    result: dict[str, Any] = r.json()
    return result


async def append(
    client: Any,
    headers: dict[str, str],
    run_id: str,
    payloads: list[Any],
    stream_id: str = "s",
    key: str | None = None,
) -> Any:
    h = dict(headers)
    if key is not None:
        h["Idempotency-Key"] = key
    return await client.post(
        stream_url(run_id, stream_id, "/records"),
        json={"records": [{"payload": p} for p in payloads]},
        headers=h,
    )


async def state(client: Any, headers: dict[str, str], run_id: str, stream_id: str = "s") -> Any:
    r = await client.get(stream_url(run_id, stream_id), headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["state"]


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["title"] and body["detail"]
    return body
