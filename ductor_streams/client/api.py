"""``StreamsClient``: the HTTP API of ductor-streams for external apps."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from ductor_streams.client.errors import ApiError, CreditExhaustedError, error_from
from ductor_streams.client.models import AppendResult, Page, Record
from ductor_streams.client.retry import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    RETRYABLE_STATUSES,
    retry_after_of,
    retry_wait,
)
from ductor_streams.client.subscribe import follow
from ductor_streams.names import API_MOUNT

API = API_MOUNT

# Gives a bearer token: called when the client starts, and again when the server says
# the token has expired (401, or an SSE stream ending with reason token_expired).
TokenProvider = Callable[[], str | Awaitable[str]]


class StreamsClient:
    """Talks to one ductor-streams deployment with one bearer token.

    Every call is retried on 502, 503 and 504 answers and on transport errors (connection
    refused or reset, timeouts), with jittered exponential backoff and never sooner than
    the server's ``Retry-After``, until the next wait would end more than
    ``retry_budget`` seconds after the first try (each call may pass its own
    ``retry_budget``) or ``max_attempts`` tries were made (None: no limit but the
    budget); then the last error is raised. Appends are also retried on 429
    ``credit_exhausted`` (raising ``CreditExhaustedError`` at the end), always with the
    same ``Idempotency-Key``, so a retried append is stored once.

    ``token`` is a bearer token, or a ``TokenProvider`` (a function, sync or async, that
    returns one). With a provider, a call answered 401 asks it for a fresh token and
    tries once more, and a subscription whose token expires reconnects with a fresh
    one; a plain token that expires ends calls with ``UnauthenticatedError``.
    """

    def __init__(
        self,
        base_url: str,
        token: str | TokenProvider,
        *,
        http: httpx.AsyncClient | None = None,
        retry_budget: float = 30.0,
        max_attempts: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._owns_http = http is None
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self.base_url = base_url.rstrip("/")
        self._provider: TokenProvider | None = None if isinstance(token, str) else token
        self._headers = {"Authorization": f"Bearer {token}"} if isinstance(token, str) else {}
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

    async def create_stream(
        self, run_id: str, definition: dict[str, Any], *, retry_budget: float | None = None
    ) -> dict[str, Any]:
        """Create (or find the identical) stream definition; returns definition + state.
        A retry after a lost answer finds the identical definition."""
        path = f"{API}/runs/{quote(run_id, safe='')}/streams"
        response = await self._call("POST", path, json=definition, retry_budget=retry_budget)
        return response.json()  # type: ignore[no-any-return]

    async def get_stream(
        self, run_id: str, stream_id: str, *, retry_budget: float | None = None
    ) -> dict[str, Any]:
        response = await self._call(
            "GET", self.stream_path(run_id, stream_id), retry_budget=retry_budget
        )
        return response.json()  # type: ignore[no-any-return]

    async def append(
        self,
        run_id: str,
        stream_id: str,
        payloads: Sequence[Any],
        *,
        idempotency_key: str | None = None,
        retry_budget: float | None = None,
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
            retry_credit=True,
            retry_budget=retry_budget,
        )
        data = response.json()
        return AppendResult(
            int(data["first_sequence"]),
            int(data["last_sequence"]),
            response.headers.get("idempotent-replayed") == "true",
        )

    async def read(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        limit: int = 100,
        *,
        fingerprint: str | None = None,
        retry_budget: float | None = None,
    ) -> Page:
        """One page of records with ``sequence > cursor``.

        ``fingerprint``: that of the record at ``cursor`` (``Record.fingerprint``, or
        the previous page's ``next_fingerprint``), to learn whether the stream still has
        it: ``HistoryDivergedError`` when not (a failover lost commits), instead of
        records that do not follow on from it. Only with a cursor above 0.
        """
        params: dict[str, Any] = {"cursor": cursor, "limit": limit}
        if fingerprint is not None:
            params["fingerprint"] = fingerprint
        response = await self._call(
            "GET",
            self.stream_path(run_id, stream_id) + "/records",
            params=params,
            retry_budget=retry_budget,
        )
        data = response.json()
        records = [Record.from_json(r) for r in data["records"]]
        return Page(
            records=records,
            next_cursor=int(data["next_cursor"]),
            earliest_sequence=int(data["earliest_sequence"]),
            latest_sequence=int(data["latest_sequence"]),
            closed=bool(data["closed"]),
            next_fingerprint=records[-1].fingerprint if records else fingerprint,
        )

    async def ack(
        self,
        run_id: str,
        stream_id: str,
        consumer_id: str,
        sequence: int,
        *,
        retry_budget: float | None = None,
    ) -> int:
        """Acknowledge up to ``sequence``; returns the consumer's ack. A retry after a
        lost answer is a no-op (the same ack again changes nothing)."""
        path = f"{self.stream_path(run_id, stream_id)}/consumers/{quote(consumer_id, safe='')}/ack"
        response = await self._call(
            "POST", path, json={"sequence": sequence}, retry_budget=retry_budget
        )
        return int(response.json()["acked_sequence"])

    async def close_stream(
        self, run_id: str, stream_id: str, *, retry_budget: float | None = None
    ) -> int:
        """Close the stream; returns its last sequence."""
        response = await self._call(
            "POST", self.stream_path(run_id, stream_id) + "/close", retry_budget=retry_budget
        )
        return int(response.json()["last_sequence"])

    def subscribe(
        self,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        *,
        fingerprint: str | None = None,
        reconnect_budget: float = 60.0,
        idle_timeout: float = 45.0,
    ) -> AsyncIterator[Record]:
        """Every record after ``cursor``, once each, in order, until the stream closes.

        Reconnects with ``Last-Event-ID`` after any disconnect, with backoff, until
        the server has been unreachable for ``reconnect_budget`` seconds
        (``ConnectionLostError``). A connection silent for ``idle_timeout`` seconds
        (the server sends keepalives at least every 15 s) counts as lost. Raises
        ``CursorExpiredError`` when retention removed records not yet received.

        Each reconnect sends the fingerprint of the last record received (and the first
        connect ``fingerprint``, that of the record at ``cursor``, when given): raises
        ``HistoryDivergedError`` when the stream no longer has that record (a database
        failover lost commits), rather than carry on after records it never had.
        """
        return follow(
            self,
            self.stream_path(run_id, stream_id) + "/subscribe",
            cursor,
            fingerprint=fingerprint,
            reconnect_budget=reconnect_budget,
            idle_timeout=idle_timeout,
        )

    @property
    def auth_headers(self) -> dict[str, str]:
        return dict(self._headers)

    async def refresh_token(self) -> bool:
        """Ask the token provider for a fresh token; False when there is none."""
        if self._provider is None:
            return False
        token = self._provider()
        if inspect.isawaitable(token):
            token = await token
        self._headers = {"Authorization": f"Bearer {token}"}
        return True

    async def _call(
        self,
        method: str,
        path: str,
        *,
        retry_credit: bool = False,
        retry_budget: float | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send the request, retrying as the class docstring says; the same ``headers``
        (an append's ``Idempotency-Key``) go with every try."""
        budget = self.retry_budget if retry_budget is None else retry_budget
        deadline = time.monotonic() + budget
        backoff = FIRST_BACKOFF
        attempt = 0
        refreshed = False
        if not self._headers:
            await self.refresh_token()
        while True:
            attempt += 1
            error: BaseException
            retry_after: float | None = None
            try:
                response = await self.http.request(
                    method, self.url(path), headers={**self._headers, **(headers or {})}, **kwargs
                )
            except httpx.TransportError as exc:
                error = exc
            else:
                if response.status_code < 400:
                    return response
                if response.status_code == 401 and not refreshed and await self.refresh_token():
                    refreshed = True  # the token may have expired: once with a fresh one
                    continue
                error = _problem(response)
                retryable = response.status_code in RETRYABLE_STATUSES or (
                    retry_credit and response.status_code == 429
                )
                if not retryable:
                    raise error
                retry_after = retry_after_of(response)
            wait = retry_wait(backoff, retry_after)
            backoff = min(backoff * 2, MAX_BACKOFF)
            out_of_attempts = self.max_attempts is not None and attempt >= self.max_attempts
            if out_of_attempts or time.monotonic() + wait > deadline:
                raise error
            await asyncio.sleep(wait)


def _problem(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = {"code": "http_error", "detail": response.text[:200]}
    error = error_from(response.status_code, body, retry_after_of(response))
    if isinstance(error, CreditExhaustedError):
        error.retry_after = retry_after_of(response) or 1.0
    return error
