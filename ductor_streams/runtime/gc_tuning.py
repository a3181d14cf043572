"""Keep Python's garbage collection from stalling a long-running process.

CPython's collector holds the event loop while it runs, and a full collection looks at
every object it tracks. A worker or server holds some hundred thousand objects from
start-up (modules, classes, the Temporal SDK, the HTTP app) that live as long as the
process, and a Temporal worker adds the modules of each sandboxed workflow it caches.
Full collections of the serve and worker processes took tens of milliseconds each, a
few times in ten seconds at 100 streaming activities: every stream of the process
stalled that long, which made most of the tail of token -> SSE latency
(docs/decisions.md, "Streaming activities").

``tune_garbage_collection``, once per process when start-up is complete:

1. collects, then moves every object alive at that moment into the collector's
   permanent generation (``gc.freeze``): later collections do not look at them. An
   object alive at start-up that later becomes part of a reference cycle is never
   freed; start-up objects live for the process anyway, so that leak is bounded by what
   start-up made.
2. makes full collections ten times rarer (the oldest generation's threshold 10 ->
   100 collections of the middle one). The young generations keep their thresholds:
   raising those made each of their collections as long as a full one. Cyclic garbage
   that reaches the oldest generation waits longer to be freed; the appends and reads
   of this package make none (a collection's unreachable objects after a load were
   completed workflows' sandboxes and closed connections).

From then on each collection's pause is observed as ``ductor_streams_gc_pause_seconds``
by generation, and ``ductor_streams_gc_frozen_objects`` says how many were frozen
(docs/operators.md, metrics).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ductor_streams.foundation import metrics
from ductor_streams.runtime import Runtime

_log = logging.getLogger(__name__)

# Collections of the middle generation between two full collections (CPython: 10).
FULL_COLLECTION_THRESHOLD = 100

_tuned = False


def tune_garbage_collection() -> bool:
    """Freeze start-up's objects and make full collections rarer, once per process
    (later calls do nothing). Call it when start-up is complete (the pool open, the app
    or worker built). Returns whether this call tuned."""
    global _tuned
    if _tuned:
        return False
    _tuned = True
    gc.collect()
    gc.freeze()
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
    gc.callbacks.append(_observe_pause)
    _log.debug(
        "froze %d start-up objects out of garbage collection; thresholds %s",
        gc.get_freeze_count(),
        gc.get_threshold(),
    )
    return True


# perf_counter() at the start of the collection under way (collections do not nest).
_started = 0.0
# The histogram's child per generation, made up front: the callback allocates nothing
# it need not (it runs inside the collector, from any thread that triggered it).
_PAUSES = tuple(metrics.GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3))


def _observe_pause(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        _PAUSES[info["generation"]].observe(time.perf_counter() - _started)


def tuned() -> bool:
    """Whether this process has tuned its garbage collection."""
    return _tuned


@contextlib.asynccontextmanager
async def tuned_after_start(_runtime: Runtime) -> AsyncIterator[None]:
    """A service (process/services.py) that tunes once every service before it has started:
    ``serve`` and ``workers`` list it last."""
    tune_garbage_collection()
    yield
