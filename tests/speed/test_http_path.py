"""The trimmed HTTP path: no thread hand-off for the guard, tokens verified once."""

from __future__ import annotations

import inspect

import pytest

from ductor_streams.auth import issue_token
from ductor_streams.errors import Unauthenticated
from ductor_streams.http import access, tokens
from ductor_streams.http.tokens import VerifiedTokens

SECRET = "s" * 32


def test_the_guard_is_a_coroutine_function() -> None:
    # Litestar runs a sync guard in a worker thread on every request.
    assert inspect.iscoroutinefunction(access.authorize)


def test_a_token_is_verified_once_until_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = tokens.verify_token

    def counting(secret: str, token: str) -> object:
        calls.append(token)
        return real(secret, token)

    monkeypatch.setattr(tokens, "verify_token", counting)
    cache = VerifiedTokens()
    token = issue_token(
        SECRET, sub="a", tenant="t", scopes=["streams:read"], runs=["*"], ttl_seconds=60
    )
    first = cache.principal(SECRET, token)
    assert cache.principal(SECRET, token) is first
    assert len(calls) == 1

    # Another secret never gets the remembered verdict.
    with pytest.raises(Unauthenticated):
        cache.principal("other" * 8, token)

    # Past its exp the token is checked again, and refused.
    now = tokens.time.time()
    monkeypatch.setattr(tokens.time, "time", lambda: now + 120)
    monkeypatch.setattr("jwt.api_jwt.datetime", _FrozenDatetime(now + 120))
    with pytest.raises(Unauthenticated, match="expired"):
        cache.principal(SECRET, token)


def test_bad_tokens_are_never_remembered() -> None:
    cache = VerifiedTokens()
    token = issue_token(SECRET, sub="a", tenant="t", scopes=[], runs=["*"])
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            cache.principal(SECRET, tampered)
    assert cache._entries == {}


def test_the_cache_is_bounded() -> None:
    cache = VerifiedTokens(max_entries=3)
    for i in range(7):
        cache.principal(SECRET, issue_token(SECRET, sub=f"u{i}", tenant="t", scopes=[], runs=["*"]))
    assert len(cache._entries) <= 3


class _FrozenDatetime:
    """Stands in for ``datetime`` inside PyJWT so that its expiry check sees ``at``."""

    def __init__(self, at: float) -> None:
        import datetime as real

        self._real = real.datetime
        self._at = at

    def now(self, tz: object = None) -> object:
        return self._real.fromtimestamp(self._at, tz)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)
