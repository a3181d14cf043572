"""Entity tags of catch-up reads: opaque, and different for every view of the data.

A tag is a keyed hash (HMAC-SHA256, 144 bits shown) of what the answer's bytes depend
on: the stream, the range read (the offset asked for, the page's first record and the
offset it reaches), whether the stream is closed there, and the redaction view (the
pointers replaced for this caller; none for ``streams:read_unredacted``). So:

- a token that gets a redacted page never matches a tag of the unredacted page, and the
  other way round: a browser cache keyed by URL never answers one with the other's copy
  (``If-None-Match`` then gets a 200 with the caller's own view, never a 304);
- the tag reveals nothing: no internal key (a stream's number would tell how many streams
  all tenants have made), no offset a caller did not send.

The key is derived from ``DUCTOR_STREAMS_JWT_SECRET``, so every replica of a deployment
gives the same tag for the same answer, and a tag means nothing to another deployment.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
from collections.abc import Sequence

# Tags are made with a key of their own, never with the signing secret itself.
_KEY_LABEL = b"ductor-streams catch-up etag v1"


@functools.lru_cache(maxsize=4)
def _key(secret: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def catch_up_etag(
    secret: str,
    stream_pk: int,
    *,
    offset: str,
    first_sequence: int | None,
    next_offset: str,
    closed: bool,
    redaction: Sequence[str],
) -> str:
    """The quoted ETag of a catch-up page (see the module docstring)."""
    view = json.dumps(
        [stream_pk, offset, first_sequence, next_offset, closed, list(redaction)],
        separators=(",", ":"),
    )
    digest = hmac.new(_key(secret), view.encode("utf-8"), hashlib.sha256).digest()[:18]
    return '"' + base64.urlsafe_b64encode(digest).decode("ascii") + '"'
