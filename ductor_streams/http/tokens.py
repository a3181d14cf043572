"""Verified bearer tokens, remembered until they expire.

HS256 verification through PyJWT was the largest single cost of an append request
(docs/speed.md, "Token cache"). A token is immutable and its
verdict depends only on the secret and the clock, so a token that verified once is
taken as verified again until its ``exp``, for the same secret. Failures are never
remembered: a bad token is checked (and refused) every time.
"""

from __future__ import annotations

import time

import jwt

from ductor_streams.auth import Principal, verify_token


class VerifiedTokens:
    """A bounded map ``(secret, token) -> (principal, exp)``; cleared whole when full."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._entries: dict[tuple[str, str], tuple[Principal, float]] = {}
        self._max_entries = max_entries

    def principal(self, secret: str, token: str) -> Principal:
        """The token's principal; raises Unauthenticated exactly as ``verify_token``."""
        key = (secret, token)
        hit = self._entries.get(key)
        if hit is not None and time.time() < hit[1]:
            return hit[0]
        principal = verify_token(secret, token)  # raises on any failure
        # Verified just now, so the unverified read of ``exp`` reads the signed value.
        exp = jwt.decode(token, options={"verify_signature": False})["exp"]
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        self._entries[key] = (principal, float(exp))
        return principal


VERIFIED_TOKENS = VerifiedTokens()
