"""Background workers that run inside ``serve`` (unless ``--no-workers``) and ``workers``.

Each worker is an async context manager factory taking the process's ``Runtime``
(ductor_streams/runtime/__init__.py); they start after it is open and stop before it closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from ductor_streams.config import Settings

if TYPE_CHECKING:
    from ductor_streams.runtime import Runtime

WorkerFactory = Callable[["Runtime"], contextlib.AbstractAsyncContextManager[None]]


def worker_services(settings: Settings) -> list[WorkerFactory]:
    """The workers this deployment runs (maintenance, dispatcher), in start order.

    They stop in the reverse order, so on SIGTERM the dispatcher hands its claimed
    deliveries back first, before upkeep stops: another dispatcher takes them sooner.
    """
    # Upkeep (retention, expiry, orphans, deletions) needs only Postgres and the stores.
    from ductor_streams.maintenance import maintenance_worker

    services: list[WorkerFactory] = [maintenance_worker(settings)]
    # Input delivery needs Temporal; without an address it is off (and said so), so that
    # a deployment without input streams runs the other workers alone. The address may
    # come from DUCTOR_STREAMS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS or a TEMPORAL_PROFILE;
    # a bad Temporal setting (TLS file, profile) is a ConfigError here, at start.
    from ductor_streams.temporal_connection import configured_address

    if configured_address(settings) is not None:
        from ductor_streams.process.dispatcher import dispatcher_service

        services.append(dispatcher_service)
    else:
        import logging

        logging.getLogger(__name__).warning(
            "input delivery is off: no Temporal address"
            " (DUCTOR_STREAMS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS or a TEMPORAL_PROFILE)"
        )
    return services
