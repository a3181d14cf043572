"""Background workers that run inside ``serve`` (unless ``--no-workers``) and ``workers``.

Each is a ``runtime.Service``: an async context manager factory given the process's
``Runtime``; they start after it is open and stop before it closes.
"""

from __future__ import annotations

import contextlib
import logging

from ductor_streams.config import Settings, UpkeepConfig
from ductor_streams.maintenance import running_upkeep
from ductor_streams.runtime import Runtime, Service

log = logging.getLogger(__name__)


def worker_services(settings: Settings) -> list[Service]:
    """The workers this deployment runs (maintenance, dispatcher), in start order.

    They stop in the reverse order, so on SIGTERM the dispatcher hands its claimed
    deliveries back first, before upkeep stops: another dispatcher takes them sooner.
    """
    # Upkeep (retention, expiry, orphans, deletions) needs only Postgres and the stores.
    services: list[Service] = [_upkeep(settings.upkeep)]
    # Input delivery needs Temporal; without an address it is off (and said so), so that
    # a deployment without input streams runs the other workers alone. The address may
    # come from DUCTOR_STREAMS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS or a TEMPORAL_PROFILE;
    # a bad Temporal setting (TLS file, profile) is a ConfigError here, at start.
    # Deferred, both: ``serve --no-workers`` never loads the Temporal client.
    from ductor_streams.temporal_connection import configured_address

    if configured_address(settings) is not None:
        from ductor_streams.process.dispatcher import dispatcher_service

        services.append(dispatcher_service)
    else:
        log.warning(
            "input delivery is off: no Temporal address"
            " (DUCTOR_STREAMS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS or a TEMPORAL_PROFILE)"
        )
    return services


def _upkeep(config: UpkeepConfig) -> Service:
    """Upkeep as a service: its passes over the runtime's pool and object stores."""

    def service(runtime: Runtime) -> contextlib.AbstractAsyncContextManager[None]:
        return running_upkeep(runtime.pool, runtime.objects.stores, config)

    return service
