"""Redaction by RFC 6901 JSON pointers: each pointer that resolves is replaced, whole
value, by the string ``"[REDACTED]"``."""

from __future__ import annotations

from typing import Any

import msgspec

REDACTED = "[REDACTED]"


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _redact_pointer(document: Any, pointer: str) -> Any:
    if pointer == "":
        return REDACTED
    tokens = [_unescape(t) for t in pointer.split("/")[1:]]
    parent = document
    for token in tokens[:-1]:
        if isinstance(parent, dict) and token in parent:
            parent = parent[token]
        elif isinstance(parent, list) and token.isdigit() and int(token) < len(parent):
            parent = parent[int(token)]
        else:
            return document
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        parent[last] = REDACTED
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        parent[int(last)] = REDACTED
    return document


def redact(payload: Any, pointers: list[str]) -> Any:
    """Return ``payload`` with every resolving pointer's value replaced (mutates)."""
    for pointer in pointers:
        payload = _redact_pointer(payload, pointer)
    return payload


def redact_json_text(payload_json: str, pointers: list[str]) -> str:
    """Redact a stored payload's compact JSON text; the text is returned as is without
    pointers."""
    if not pointers:
        return payload_json
    redacted = redact(msgspec.json.decode(payload_json), pointers)
    return msgspec.json.encode(redacted).decode()
