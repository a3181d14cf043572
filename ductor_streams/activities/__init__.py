"""Temporal activities over the stream store, and their types.

``StreamsActivities`` holds the activities (create, append, close, ack, read); the
``StreamsPlugin`` registers them. ``error_types`` names every ApplicationError type they
raise; ``models`` holds their inputs and results (sandbox-safe dataclasses).

Workflow code imports ``error_types`` and ``models`` inside Temporal's sandbox
(``plugin/workflow.py``), where this package is passed through: importing the package
must therefore not load the store, asyncpg or anything else of the activities' own side.
Those load on first use of ``StreamsActivities``, ``domain_errors`` or
``to_application_error`` (``tests/foundation/test_imports.py`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ductor_streams.activities import error_types, models

if TYPE_CHECKING:
    from ductor_streams.activities.application_errors import domain_errors, to_application_error
    from ductor_streams.activities.streams import StreamsActivities

__all__ = [
    "StreamsActivities",
    "domain_errors",
    "error_types",
    "models",
    "objects",
    "to_application_error",
]

_LAZY = {
    "StreamsActivities": "ductor_streams.activities.streams",
    "domain_errors": "ductor_streams.activities.application_errors",
    "to_application_error": "ductor_streams.activities.application_errors",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "objects":  # the large-object helpers for activity code (a module)
        return importlib.import_module("ductor_streams.activities.objects")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
