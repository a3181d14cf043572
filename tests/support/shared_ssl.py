"""One default SSL context for every httpx client the tests make.

httpx builds an SSL context for each client, loading the system's CA bundle (about
36 ms of CPU here), even when the client only ever speaks plain HTTP to a loopback
server. The tests make thousands of clients (the security matrices make one per case):
over a minute of CPU per run. Clients that ask for the default verification share one
context instead; an SSL context is safe to share between connections. Clients given a
context or ``verify=False`` of their own are unchanged.

httpx's transports call ``create_ssl_context`` from the module they import it into, so
that name is the one replaced; if a later httpx moves it, nothing is replaced and the
tests only run slower (``share_default_ssl_context`` returns False).
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx
from httpx._transports import default as _transports


def share_default_ssl_context() -> bool:
    """Make httpx's transports reuse one default context; True when in place."""
    original = getattr(_transports, "create_ssl_context", None)
    if original is not httpx.create_ssl_context:
        return original is not None and getattr(original, "shared", False)
    shared_default = functools.cache(lambda: httpx.create_ssl_context())

    def create_ssl_context(
        verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return shared_default()
        return original(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared = True  # type: ignore[attr-defined]
    _transports.create_ssl_context = create_ssl_context  # type: ignore[assignment]
    return True
