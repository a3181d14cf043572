"""The resumable subscription behind ``StreamsClient.subscribe``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Protocol

import httpx
from httpx_sse import aconnect_sse

from ductor_streams.client.errors import ConnectionLostError, error_from
from ductor_streams.client.models import Record
from ductor_streams.client.retry import FIRST_BACKOFF, MAX_BACKOFF, RETRYABLE_STATUSES, retry_wait


class Session(Protocol):
    """What a subscription needs of its client (``StreamsClient`` is one): the HTTP
    client, URLs, the current token's headers and a way to refresh the token."""

    http: httpx.AsyncClient

    @property
    def auth_headers(self) -> dict[str, str]: ...

    def url(self, path: str) -> str: ...

    async def refresh_token(self) -> bool: ...


class _Dropped(Exception):
    """The connection ended without ``end``: reconnect."""


async def follow(
    client: Session,
    path: str,
    cursor: int,
    *,
    fingerprint: str | None = None,
    reconnect_budget: float,
    idle_timeout: float,
) -> AsyncIterator[Record]:
    last = cursor
    # The fingerprint of the record at ``last``, sent with it: the server answers
    # history_diverged when the stream no longer has that record.
    last_fingerprint = fingerprint if cursor else None
    delay = FIRST_BACKOFF
    retry_after: float | None = None  # the last refusal's Retry-After
    down_since: float | None = None
    timeout = httpx.Timeout(10.0, read=idle_timeout)
    refreshed = False
    if not client.auth_headers:
        await client.refresh_token()
    while True:
        try:
            headers = {**client.auth_headers, "Last-Event-ID": str(last)}
            params = {"fingerprint": last_fingerprint} if last_fingerprint is not None else None
            async with aconnect_sse(
                client.http,
                "GET",
                client.url(path),
                headers=headers,
                params=params,
                timeout=timeout,
            ) as source:
                response = source.response
                if response.status_code != 200:
                    await response.aread()
                    try:
                        problem = response.json()
                    except ValueError:
                        problem = {"code": "http_error", "detail": response.text[:200]}
                    error = error_from(response.status_code, problem)
                    if (
                        response.status_code == 401
                        and not refreshed
                        and await client.refresh_token()
                    ):
                        refreshed = True  # once with a fresh token, then the 401 stands
                        continue
                    # Trying again later can succeed (502, 503, 504); any other problem
                    # is final.
                    if response.status_code in RETRYABLE_STATUSES:
                        raw = response.headers.get("retry-after", "").strip()
                        retry_after = float(raw) if raw.isdigit() else None
                        raise _Dropped() from error
                    raise error
                down_since, delay, refreshed = None, FIRST_BACKOFF, False
                token_expired = False
                async for event in source.aiter_sse():
                    if event.event == "record":
                        record = Record.from_json(json.loads(event.data))
                        if record.sequence <= last:
                            continue  # never repeat, whatever happens to the connection
                        last = record.sequence
                        last_fingerprint = record.fingerprint
                        yield record
                    elif event.event == "end":
                        return
                    elif event.event == "error":
                        raise error_from(410, json.loads(event.data))
                    elif event.event == "reconnect":
                        token_expired = json.loads(event.data).get("reason") == "token_expired"
                if token_expired and await client.refresh_token():
                    refreshed = True
                    continue  # at once, with the fresh token, from the last record
                raise _Dropped()
        except (httpx.TransportError, _Dropped) as exc:
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > reconnect_budget:
                raise ConnectionLostError(
                    f"no connection to the stream for {reconnect_budget:g} s"
                ) from exc
            await asyncio.sleep(retry_wait(delay, retry_after))
            delay, retry_after = min(delay * 2, MAX_BACKOFF), None
