"""The Temporal wait service: signal ``ductor_streams.input`` to workflow ID = run ID."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from ductor_streams.delivery.wait_service import (
    DeliveryFailed,
    InputEvent,
    RunGone,
    RunNotFound,
)
from ductor_streams.foundation.signals import INPUT_SIGNAL

ClientFactory = Callable[[], Awaitable[Client]]


class TemporalWaitService:
    """Delivers input events as Temporal signals, classifying the failures.

    NOT_FOUND for a completed or terminated workflow is permanent (RunGone); for an ID
    that has no workflow it is RunNotFound (the run may still be starting); anything
    else (unavailable, deadline, resource exhausted) is retryable.

    Give it a connected ``client``, or ``connect`` (a factory) to connect on first use:
    then an unreachable Temporal is an ordinary retryable failure of each delivery,
    recorded in Postgres, instead of a process that cannot start.
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        connect: ClientFactory | None = None,
        rpc_timeout: timedelta = timedelta(seconds=10),
        reconnect_after: float = 2.0,
    ) -> None:
        if client is None and connect is None:
            raise ValueError("give a client or a connect factory")
        self._client = client
        self._connect = connect
        self._rpc_timeout = rpc_timeout
        self._reconnect_after = reconnect_after
        self._lock = asyncio.Lock()
        self._failed_at = float("-inf")
        self._failure = ""

    @classmethod
    def connecting(cls, address: str, namespace: str) -> TemporalWaitService:
        """A service that connects to ``address`` when it first delivers."""

        async def connect() -> Client:
            return await Client.connect(address, namespace=namespace)

        return cls(connect=connect)

    async def client(self) -> Client:
        """The client, connecting once; after a failed connect, fail fast for a while."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is not None:
                return self._client
            if time.monotonic() - self._failed_at < self._reconnect_after:
                raise DeliveryFailed(self._failure)
            assert self._connect is not None
            try:
                self._client = await self._connect()
            except (RuntimeError, OSError) as exc:
                self._failed_at = time.monotonic()
                self._failure = f"temporal unreachable: {exc}"[:500]
                raise DeliveryFailed(self._failure) from None
            return self._client

    async def deliver(self, event: InputEvent) -> None:
        handle = (await self.client()).get_workflow_handle(event.run_id)
        try:
            await handle.signal(INPUT_SIGNAL, event.to_signal(), rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                if "completed" in exc.message:
                    raise RunGone(f"workflow {event.run_id!r} has completed") from None
                raise RunNotFound(f"no workflow with ID {event.run_id!r}") from None
            raise DeliveryFailed(f"temporal {exc.status.name}: {exc.message}") from None
        except RuntimeError as exc:  # e.g. the client lost its connection
            raise DeliveryFailed(f"temporal client: {exc}") from None
