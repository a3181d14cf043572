"""One upkeep step's failure stays that step's: the pass goes on with the others.

A pass walks every stream with a retention limit, every expired intent, every region's
stored keys and every due deletion. One bad item (a stream whose stored definition the
store cannot compute with, a region whose bucket cannot be listed) must not stop the
pass, or pruning, expiry and cleanup would stop for every later stream of every tenant.
So each step runs inside ``isolated``: an error is logged (one warning line: the step,
the item's key and the error type, never a payload, nor the error's text, which can
quote data) and counted in ``ductor_streams_upkeep_errors_total{step=...}``, and the
caller moves on to the next item. The next pass tries the failed item again.

An unavailable database is not a step's failure but the whole pass's: it propagates, so
that the upkeep loop backs off (maintenance/upkeep.py) instead of stepping over every
item one failure at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ductor_streams.foundation import metrics
from ductor_streams.store.db import database_unavailable

log = logging.getLogger(__name__)


@contextlib.contextmanager
def isolated(step: str, **key: int | str | None) -> Iterator[None]:
    """Run one item of ``step``; an error (other than an unavailable database) is logged
    with ``key`` (identifiers only, e.g. ``stream_pk``) and counted, then swallowed."""
    try:
        yield
    except Exception as exc:
        if database_unavailable(exc):
            raise
        metrics.UPKEEP_ERRORS.labels(step).inc()
        log.warning(
            "upkeep step failed",
            extra={"step": step, "error_type": type(exc).__name__, **key},
        )
