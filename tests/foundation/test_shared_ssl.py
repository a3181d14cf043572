"""The tests' shared default SSL context for httpx (tests/support/shared_ssl.py): in
place, shared by default clients, and leaving other verification settings alone."""

from __future__ import annotations

import ssl

import httpx

from tests.support.shared_ssl import share_default_ssl_context


def _context(client: httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_default_clients_share_one_context_and_others_keep_their_own() -> None:
    assert share_default_ssl_context()
    with httpx.Client() as a, httpx.Client() as b, httpx.Client(verify=False) as plain:
        assert _context(a) is _context(b)
        assert _context(a).verify_mode is ssl.CERT_REQUIRED and _context(a).check_hostname
        assert _context(plain) is not _context(a)
        assert _context(plain).verify_mode is ssl.CERT_NONE
