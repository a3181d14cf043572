"""ductor-streams: durable data streams for Temporal workflow runs, kept in Postgres.

What applications use is named in ``__all__`` and loads on first use, so that importing
the package (as the workflow helpers do inside Temporal's sandbox) loads nothing else:

- ``Settings``: every setting of a process, from the environment (``ductor_streams.config``);
- ``StreamsPlugin``: the Temporal plugin for client and worker (``ductor_streams.plugin``;
  the workflow helpers are ``ductor_streams.plugin.workflow``, the activity helpers
  ``ductor_streams.plugin.streaming``);
- ``StreamsClient``: the HTTP client for external apps (``ductor_streams.client``, with
  the ``client`` extra);
- ``issue_token``: a signed bearer token (``ductor_streams.auth``).

The layers beneath (docs/architecture.md): ``process`` (the ``ductor-streams`` command),
``http``, ``plugin``, ``client``, ``activities``, ``runtime``, ``delivery``,
``maintenance``, ``ops``, ``live``, ``objects``, ``store``, ``compat``, ``schema`` and
``foundation``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ductor_streams.auth import issue_token
    from ductor_streams.client import StreamsClient
    from ductor_streams.config import Settings
    from ductor_streams.plugin import StreamsPlugin

__version__ = "0.1.0"

__all__ = ["Settings", "StreamsClient", "StreamsPlugin", "__version__", "issue_token"]

# Loaded on first use: the workflow sandbox imports this package, and must not load the
# plugin's store and driver by doing so (tests/foundation/test_imports.py).
_LAZY = {
    "Settings": "ductor_streams.config",
    "StreamsClient": "ductor_streams.client",
    "StreamsPlugin": "ductor_streams.plugin",
    "issue_token": "ductor_streams.auth",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
