"""A client's going away, as ASGI tells it: ``receive()`` answers ``http.disconnect``.

Once a request's body has been read whole, ``receive()`` waits until the connection
closes (or the response is complete) and then answers ``http.disconnect``. Every wait
on a client's behalf (a long-poll, an append or object commit blocked on credit)
watches for it, so that a client that has gone costs no more work (docs/security.md,
"Callers that go away").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ductor_streams.store.gone import CallerGone, unless_gone

# An ASGI ``receive``: the fronts' own alias, or Litestar's ``Request.receive``.
Receive = Callable[[], Awaitable[Any]]

T = TypeVar("T")


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone (the rest of an unread body is dropped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def caller_gone(receive: Receive) -> CallerGone:
    """What a store wait takes as ``caller_gone``. Called only once a watch starts (a
    wait, or a large or ``block`` append's first attempt), so a request that is never
    watched never reads ``receive`` again."""
    return lambda: disconnected(receive)


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone (``work`` cancelled) if the client goes first."""
    return await unless_gone(work, disconnected(receive))
