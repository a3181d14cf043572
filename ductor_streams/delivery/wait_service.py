"""The wait-service interface: how an input record reaches the run that waits for it.

The dispatcher knows only this interface; ``delivery.temporal`` implements it with a
Temporal signal. Implementations classify every failure as retryable or permanent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ductor_streams.foundation.signals import InputSignal
from ductor_streams.foundation.signals import input_event_id as event_id


@dataclass(frozen=True, slots=True)
class InputEvent:
    """One input record on its way to the run (workflow ID = run ID)."""

    tenant: str
    run_id: str
    stream_id: str
    sequence: int
    payload: Any
    object: dict[str, Any] | None
    appended_at: str | None

    @property
    def event_id(self) -> str:
        return event_id(self.stream_id, self.sequence)

    def to_signal(self) -> InputSignal:
        """The input signal's argument (ductor_streams/foundation/signals.py) for this record."""
        return InputSignal(
            event_id=self.event_id,
            stream_id=self.stream_id,
            sequence=self.sequence,
            payload=self.payload,
            object=self.object,
            appended_at=self.appended_at,
        )


class DeliveryFailed(Exception):
    """A delivery attempt failed but may succeed later (back off and retry)."""


class RunGone(Exception):
    """The run can never receive input again (completed, terminated, never existed)."""


class RunNotFound(RunGone):
    """No run with this ID exists (yet): permanent only once the delivery is old enough."""


class WaitService(Protocol):
    """Resumes a waiting run with an input event."""

    async def deliver(self, event: InputEvent) -> None:
        """Deliver one event; raise DeliveryFailed or RunGone (or RunNotFound)."""
        ...
