"""The Temporal side: ``StreamsPlugin`` (client and worker) and, in ``plugin.workflow``,
the helpers that workflow code uses (import those inside the sandbox).

Importing ``plugin.workflow`` imports this package first, inside the sandbox's reach: so
``StreamsPlugin`` (which brings the activities, the store and asyncpg) loads on first
use, not here (``tests/foundation/test_imports.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ductor_streams.plugin._plugin import PLUGIN_NAME, StreamsPlugin

__all__ = ["PLUGIN_NAME", "StreamsPlugin"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ductor_streams.plugin import _plugin

    value = getattr(_plugin, name)
    globals()[name] = value
    return value
