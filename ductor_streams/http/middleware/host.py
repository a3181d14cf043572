"""The request's ``Host`` header, checked before anything answers, and the absolute URLs
built from it.

HTTP says a request with more than one ``Host``, or one whose value is not a host, is
answered 400 (RFC 9112, section 3.2). Here that is a problem with the code
``invalid_host``, before CORS, routing or authentication (``StreamsApp``, http/app.py).
A well-formed ``Host`` is a DNS name (letters, digits, ``-``, ``.``, ``_``, ``~``), an
IPv4 address or a bracketed IPv6 literal, with an optional port. An empty ``Host``
(allowed when the target has no authority) and a missing one (HTTP/1.0) are accepted.

The only URL the server hands out is a Durable Streams PUT's ``Location``, which the
protocol's clients take as an absolute URL. It starts with ``DUCTOR_STREAMS_PUBLIC_URL``
when that is set, else with the scheme and the address the connection arrived at (the
server's own socket, as the ASGI server reports it). Nothing a client sends lands in a
response header: not even a well-formed ``Host``, which would name whatever host the
client claimed. Behind a proxy, set ``DUCTOR_STREAMS_PUBLIC_URL``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, MutableMapping
from typing import Any

from ductor_streams.config import Settings
from ductor_streams.errors import InvalidHost

_HOST = re.compile(
    rb"(?:[A-Za-z0-9._~-]{1,255}|\[[0-9A-Fa-f:.]{2,45}(?:%25[A-Za-z0-9._~-]{1,64})?\])"
    rb"(?::[0-9]{1,5})?"
)


def host_error(headers: Iterable[tuple[bytes, bytes]]) -> InvalidHost | None:
    """The refusal of a request whose ``Host`` is given twice or malformed, else None."""
    found: bytes | None = None
    for name, value in headers:
        # ASGI servers hand header names in lower case; compare without lowering each.
        if name == b"host" or (len(name) == 4 and name.lower() == b"host"):
            if found is not None:
                return InvalidHost("the request has more than one Host header")
            found = value
    if found and not _HOST.fullmatch(found):
        return InvalidHost("the Host header is not a host name or address with an optional port")
    return None


def location_url(settings: Settings, scope: MutableMapping[str, Any], path: str) -> str:
    """``path`` (absolute, from the request's own route) as an absolute URL: after
    ``DUCTOR_STREAMS_PUBLIC_URL``, else after the scheme and the address this
    connection arrived at (never the request's ``Host``)."""
    if settings.public_url:
        return settings.public_url + path
    server = scope.get("server") or ("localhost", None)
    address, port = server[0], server[1]
    if ":" in address:
        address = f"[{address}]"
    host = address if port is None else f"{address}:{port}"
    scheme = "https" if scope.get("scheme") == "https" else "http"
    return f"{scheme}://{host}{path}"
