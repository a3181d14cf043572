"""The Temporal wait service: signal ``ductor_streams.input`` to workflow ID = run ID."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from ductor_streams.delivery.wait_service import (
    INPUT_SIGNAL,
    DeliveryFailed,
    InputEvent,
    RunGone,
    RunNotFound,
)


class TemporalWaitService:
    """Delivers input events as Temporal signals, classifying the failures.

    NOT_FOUND for a completed or terminated workflow is permanent (RunGone); for an ID
    that has no workflow it is RunNotFound (the run may still be starting); anything
    else (unavailable, deadline, resource exhausted) is retryable.
    """

    def __init__(self, client: Client, *, rpc_timeout: timedelta = timedelta(seconds=10)) -> None:
        self._client = client
        self._rpc_timeout = rpc_timeout

    async def deliver(self, event: InputEvent) -> None:
        handle = self._client.get_workflow_handle(event.run_id)
        try:
            await handle.signal(INPUT_SIGNAL, event.to_signal_arg(), rpc_timeout=self._rpc_timeout)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                if "completed" in exc.message:
                    raise RunGone(f"workflow {event.run_id!r} has completed") from None
                raise RunNotFound(f"no workflow with ID {event.run_id!r}") from None
            raise DeliveryFailed(f"temporal {exc.status.name}: {exc.message}") from None
        except RuntimeError as exc:  # e.g. the client lost its connection
            raise DeliveryFailed(f"temporal client: {exc}") from None
