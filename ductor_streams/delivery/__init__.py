"""Input delivery: the outbox dispatcher and the wait-service interface it delivers through.

The dispatcher (``delivery.dispatcher``) is core code: it knows the ``WaitService``
interface only. ``delivery.temporal`` implements it with a Temporal signal and
``process.dispatcher`` runs a dispatcher inside ``serve``/``workers``.
"""

from ductor_streams.delivery.dispatcher import Dispatcher, DispatcherConfig
from ductor_streams.delivery.wait_service import (
    DeliveryFailed,
    InputEvent,
    RunGone,
    RunNotFound,
    WaitService,
    event_id,
)
from ductor_streams.foundation.signals import INPUT_SIGNAL, InputSignal

__all__ = [
    "INPUT_SIGNAL",
    "DeliveryFailed",
    "Dispatcher",
    "DispatcherConfig",
    "InputEvent",
    "InputSignal",
    "RunGone",
    "RunNotFound",
    "WaitService",
    "event_id",
]
