"""The process's runtime as the HTTP layer reaches it: one typed way in.

The app's lifespan (http/app.py) puts the ``Runtime`` (ductor_streams/runtime/__init__.py) in the
app's state under ``runtime``; handlers and the fronts before Litestar read the pool,
store, hub, followers and object service from it, never from names of their own.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.datastructures import State

from ductor_streams.runtime import Runtime


def runtime_in(state: State) -> Runtime:
    """The runtime held in the app's state (set while the app's lifespan runs)."""
    runtime: Runtime = state.runtime
    return runtime


def runtime_of(request: ASGIConnection[Any, Any, Any, Any]) -> Runtime:
    """The runtime of the app that is answering ``request``."""
    return runtime_in(request.app.state)
