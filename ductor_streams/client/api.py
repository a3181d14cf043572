"""``StreamsClient``: the HTTP API of ductor-streams for external apps."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ductor_streams.client.errors import ApiError, CreditExhaustedError, error_from

API = "/api/workflow-streams"


@dataclass(frozen=True, slots=True)
class Record:
    """A record as the API returns it (``appended_at`` is ISO 8601 text)."""

    sequence: int
    payload: Any
    size: int
    appended_at: str
    object: dict[str, Any] | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(
            sequence=int(data["sequence"]),
            payload=data["payload"],
            size=int(data["size"]),
            appended_at=str(data["appended_at"]),
            object=data.get("object"),
        )


@dataclass(frozen=True, slots=True)
class Page:
    records: list[Record]
    next_cursor: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool


class StreamsClient:
    """Talks to one ductor-streams deployment with one bearer token.

    Appends are retried, always with the same ``Idempotency-Key``, on 429 (after the
    server's ``Retry-After``), 503 and transport errors, while the waits fit in
    ``retry_budget`` seconds and the tries in ``max_attempts``; then the last error is
    raised (``CreditExhaustedError`` for 429).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        http: httpx.AsyncClient | None = None,
        retry_budget: float = 30.0,
        max_attempts: int = 8,
        timeout: float = 30.0,
    ) -> None:
        self._owns_http = http is None
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.retry_budget = retry_budget
        self.max_attempts = max_attempts

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    def stream_path(self, run_id: str, stream_id: str) -> str:
        return f"{API}/runs/{quote(run_id, safe='')}/streams/{quote(stream_id, safe='')}"

    def url(self, path: str) -> str:
        return self.base_url + path

    async def create_stream(self, run_id: str, definition: dict[str, Any]) -> dict[str, Any]:
        """Create (or find the identical) stream definition; returns definition + state."""
        path = f"{API}/runs/{quote(run_id, safe='')}/streams"
        return (await self._call("POST", path, json=definition)).json()  # type: ignore[no-any-return]

    async def get_stream(self, run_id: str, stream_id: str) -> dict[str, Any]:
        return (await self._call("GET", self.stream_path(run_id, stream_id))).json()  # type: ignore[no-any-return]

    async def append(
        self,
        run_id: str,
        stream_id: str,
        payloads: Sequence[Any],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append 1 to 1,000 payloads atomically.

        Without ``idempotency_key`` a fresh one is made, so the client's own retries
        never append twice; pass your own to make retries across restarts safe too.
        """
        key = idempotency_key or uuid.uuid4().hex
        body = {"records": [{"payload": p} for p in payloads]}
        response = await self._call(
            "POST",
            self.stream_path(run_id, stream_id) + "/records",
            json=body,
            headers={"Idempotency-Key": key},
            retry=True,
        )
        data = response.json()
        return AppendResult(
            int(data["first_sequence"]),
            int(data["last_sequence"]),
            response.headers.get("idempotent-replayed") == "true",
        )

    async def read(self, run_id: str, stream_id: str, cursor: int = 0, limit: int = 100) -> Page:
        """One page of records with ``sequence > cursor``."""
        response = await self._call(
            "GET",
            self.stream_path(run_id, stream_id) + "/records",
            params={"cursor": cursor, "limit": limit},
        )
        data = response.json()
        return Page(
            records=[Record.from_json(r) for r in data["records"]],
            next_cursor=int(data["next_cursor"]),
            earliest_sequence=int(data["earliest_sequence"]),
            latest_sequence=int(data["latest_sequence"]),
            closed=bool(data["closed"]),
        )

    async def ack(self, run_id: str, stream_id: str, consumer_id: str, sequence: int) -> int:
        path = f"{self.stream_path(run_id, stream_id)}/consumers/{quote(consumer_id, safe='')}/ack"
        response = await self._call("POST", path, json={"sequence": sequence})
        return int(response.json()["acked_sequence"])

    async def close_stream(self, run_id: str, stream_id: str) -> int:
        """Close the stream; returns its last sequence."""
        response = await self._call("POST", self.stream_path(run_id, stream_id) + "/close")
        return int(response.json()["last_sequence"])

    def subscribe(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        *,
        reconnect_budget: float = 60.0,
        idle_timeout: float = 45.0,
    ) -> AsyncIterator[Record]:
        """Every record after ``cursor``, once each, in order, until the stream closes.

        Reconnects with ``Last-Event-ID`` after any disconnect, with backoff, until
        the server has been unreachable for ``reconnect_budget`` seconds
        (``ConnectionLostError``). A connection silent for ``idle_timeout`` seconds
        (the server sends keepalives at least every 15 s) counts as lost. Raises
        ``CursorExpiredError`` when retention removed records not yet received.
        """
        from ductor_streams.client.subscribe import follow

        return follow(
            self,
            self.stream_path(run_id, stream_id) + "/subscribe",
            cursor,
            reconnect_budget=reconnect_budget,
            idle_timeout=idle_timeout,
        )

    @property
    def auth_headers(self) -> dict[str, str]:
        return dict(self._headers)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        retry: bool = False,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        deadline = time.monotonic() + self.retry_budget
        backoff = 0.1
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            error: BaseException
            try:
                response = await self.http.request(
                    method, self.url(path), headers={**self._headers, **(headers or {})}, **kwargs
                )
            except httpx.TransportError as exc:
                if not retry:
                    raise
                error, wait = exc, backoff
                backoff = min(backoff * 2, 5.0)
            else:
                if response.status_code < 400:
                    return response
                error = _problem(response)
                if not retry or response.status_code not in (429, 503):
                    raise error
                wait = _retry_after(response) or backoff
                backoff = min(backoff * 2, 5.0)
            if attempt >= self.max_attempts or time.monotonic() + wait > deadline:
                raise error
            await asyncio.sleep(wait)


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after", "").strip()
    return float(raw) if raw.isdigit() else None


def _problem(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {"code": "http_error", "detail": response.text[:200]}
    error = error_from(response.status_code, body, _retry_after(response))
    if isinstance(error, CreditExhaustedError):
        error.retry_after = _retry_after(response) or 1.0
    return error
