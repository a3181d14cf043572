"""Attacks on the bearer token, each against the real server: ``alg: none``, algorithm
confusion, other algorithms, tampered claims and headers, huge tokens and wrong claim
types. Every one is 401 ``unauthenticated`` and reveals nothing."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ductor_streams.auth import MAX_TOKEN_LENGTH, SCOPES, verify_token
from ductor_streams.errors import Unauthenticated
from tests.conftest import JWT_SECRET
from tests.security.test_auth_matrix import assert_problem
from tests.security.world import World, bearer


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _segments(header: dict[str, Any], claims: dict[str, Any], signature: str = "") -> str:
    return ".".join(
        [_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode()), signature]
    )


def _claims(world: World, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": "alice",
        "tenant": world.tenant,
        "scopes": list(SCOPES),
        "runs": ["*"],
        "iat": now,
        "exp": now + 600,
    }
    for key, value in changes.items():
        if value is _DROP:
            claims.pop(key)
        else:
            claims[key] = value
    return claims


_DROP = object()
_KID_HEADER = _b64(b'{"alg":"HS256","kid":"x"}')
_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_RSA_PUBLIC_PEM = _RSA.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)
_EC = ec.generate_private_key(ec.SECP256R1())


def _forged_tokens(world: World) -> dict[str, str]:
    claims = _claims(world)
    good = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    head, body, sig = good.split(".")
    tampered_claims = {**claims, "tenant": world.tenant + "-x", "runs": ["*"]}
    hs256_header = {"alg": "HS256", "typ": "JWT"}
    return {
        "alg_none": _segments({"alg": "none", "typ": "JWT"}, claims),
        "alg_None": _segments({"alg": "None", "typ": "JWT"}, claims),
        "alg_NONE_with_signature": _segments({"alg": "NONE"}, claims, sig),
        "alg_missing": _segments({"typ": "JWT"}, claims, sig),
        "hs512_right_secret": jwt.encode(claims, JWT_SECRET, algorithm="HS512"),
        "hs384_right_secret": jwt.encode(claims, JWT_SECRET, algorithm="HS384"),
        "rs256": jwt.encode(claims, _RSA, algorithm="RS256"),
        "es256": jwt.encode(claims, _EC, algorithm="ES256"),
        # Algorithm confusion: HS256 keyed with a public key the attacker knows.
        "hs256_keyed_with_rsa_public_pem": _segments(
            hs256_header,
            claims,
            _b64(
                __import__("hmac")
                .new(
                    _RSA_PUBLIC_PEM,
                    f"{_b64(json.dumps(hs256_header).encode())}."
                    f"{_b64(json.dumps(claims).encode())}".encode(),
                    "sha256",
                )
                .digest()
            ),
        ),
        "embedded_jwk_header": jwt.encode(
            claims,
            _RSA,
            algorithm="RS256",
            headers={"jwk": json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_RSA.public_key()))},
        ),
        "jku_header": jwt.encode(
            claims, _RSA, algorithm="RS256", headers={"jku": "http://127.0.0.1:1/jwks.json"}
        ),
        "tampered_claims": f"{head}.{_b64(json.dumps(tampered_claims).encode())}.{sig}",
        "tampered_header": _KID_HEADER + f".{body}.{sig}",
        "signature_stripped": f"{head}.{body}.",
        "signature_of_other_token": f"{head}.{body}.{_b64(b'0' * 32)}",
        "two_segments": f"{head}.{body}",
        "four_segments": f"{good}.{sig}",
        "base64_padding_garbage": f"{head}.{body}.{sig}====",
        "huge_token": jwt.encode(
            {**claims, "pad": "x" * (MAX_TOKEN_LENGTH + 10)}, JWT_SECRET, algorithm="HS256"
        ),
        "not_json_payload": f"{head}.{_b64(b'not json')}.{sig}",
    }


FORGERIES = [
    "alg_none",
    "alg_None",
    "alg_NONE_with_signature",
    "alg_missing",
    "hs512_right_secret",
    "hs384_right_secret",
    "rs256",
    "es256",
    "hs256_keyed_with_rsa_public_pem",
    "embedded_jwk_header",
    "jku_header",
    "tampered_claims",
    "tampered_header",
    "signature_stripped",
    "signature_of_other_token",
    "two_segments",
    "four_segments",
    "base64_padding_garbage",
    "huge_token",
    "not_json_payload",
]

# Well signed (HS256, right secret) but with a claim missing or of the wrong type.
BAD_CLAIMS: dict[str, dict[str, Any]] = {
    "no_sub": {"sub": _DROP},
    "no_tenant": {"tenant": _DROP},
    "no_scopes": {"scopes": _DROP},
    "no_runs": {"runs": _DROP},
    "no_exp": {"exp": _DROP},
    "sub_int": {"sub": 7},
    "sub_empty": {"sub": ""},
    "sub_list": {"sub": ["alice"]},
    "tenant_null": {"tenant": None},
    "tenant_empty": {"tenant": ""},
    "tenant_object": {"tenant": {"id": "t"}},
    "scopes_string": {"scopes": "streams:read streams:write"},
    "scopes_with_int": {"scopes": ["streams:read", 1]},
    "scopes_object": {"scopes": {"streams:read": True}},
    "runs_string": {"runs": "*"},
    "runs_nested": {"runs": [["*"]]},
    "runs_null": {"runs": None},
    "region_int": {"region": 3},
    "region_list": {"region": ["local"]},
    "exp_string": {"exp": "tomorrow"},
    "exp_past": {"exp": 1},
    "exp_bool": {"exp": True},
    "nbf_future": {"nbf": 4_000_000_000},
    "sub_nul": {"sub": "ali\u0000ce"},
    "tenant_nul": {"tenant": "t\u0000"},
    "runs_nul": {"runs": ["*", "r\u0000"]},
    "scopes_nul": {"scopes": ["streams:read\u0000"]},
    "region_nul": {"region": "lo\u0000cal"},
}


@pytest.mark.parametrize("name", FORGERIES)
async def test_forged_tokens_are_401(world: World, name: str) -> None:
    token = _forged_tokens(world)[name]
    r = await world.http.get(world.url("/records"), headers={"Authorization": f"Bearer {token}"})
    assert_problem(r, r.content, 401, "unauthenticated")
    assert world.open_marker not in r.text


@pytest.mark.parametrize("name", sorted(BAD_CLAIMS))
async def test_wrong_claims_are_401(world: World, name: str) -> None:
    token = jwt.encode(_claims(world, **BAD_CLAIMS[name]), JWT_SECRET, algorithm="HS256")
    r = await world.http.get(world.url("/records"), headers={"Authorization": f"Bearer {token}"})
    assert_problem(r, r.content, 401, "unauthenticated")


@pytest.mark.parametrize("name", sorted(BAD_CLAIMS))
def test_verify_token_rejects_wrong_claims(name: str) -> None:
    claims = {
        "sub": "a",
        "tenant": "t",
        "scopes": ["streams:read"],
        "runs": ["*"],
        "exp": int(time.time()) + 60,
    }
    for key, value in BAD_CLAIMS[name].items():
        if value is _DROP:
            claims.pop(key)
        else:
            claims[key] = value
    with pytest.raises(Unauthenticated):
        verify_token(JWT_SECRET, jwt.encode(claims, JWT_SECRET, algorithm="HS256"))


async def test_the_genuine_token_works_and_the_scheme_is_case_insensitive(world: World) -> None:
    token = jwt.encode(_claims(world), JWT_SECRET, algorithm="HS256")
    for scheme in ("Bearer", "bearer", "BEARER"):
        r = await world.http.get(
            world.url("/records"), headers={"Authorization": f"{scheme} {token}"}
        )
        assert r.status_code == 200, r.text
        assert world.open_marker in r.text


@pytest.mark.parametrize(
    "value",
    [
        "Bearer {token} {token}",
        "Bearer {token},Bearer {token}",
        "Bearer  {token}x",
        "Token {token}",
        "{token}",
    ],
)
async def test_mangled_authorization_headers_are_401(world: World, value: str) -> None:
    token = jwt.encode(_claims(world), JWT_SECRET, algorithm="HS256")
    r = await world.http.get(
        world.url("/records"), headers={"Authorization": value.format(token=token)}
    )
    assert_problem(r, r.content, 401, "unauthenticated")


async def test_secret_must_match_exactly(world: World) -> None:
    for secret in (JWT_SECRET[:-1], JWT_SECRET + "x", JWT_SECRET.upper(), ""):
        token = jwt.encode(_claims(world), secret or "k", algorithm="HS256")
        r = await world.http.get(
            world.url("/records"), headers={"Authorization": f"Bearer {token}"}
        )
        assert_problem(r, r.content, 401, "unauthenticated")


@pytest.mark.parametrize("size", [MAX_TOKEN_LENGTH + 1, 20 * 1024])
async def test_huge_tokens_are_401(world: World, size: int) -> None:
    r = await world.http.get(
        world.url("/records"), headers={"Authorization": "Bearer " + "a" * size}
    )
    assert_problem(r, r.content, 401, "unauthenticated")


@pytest.mark.parametrize("size", [64 * 1024, 200 * 1024])
async def test_huge_authorization_headers_are_431(world: World, size: int) -> None:
    r = await world.http.get(
        world.url("/records"), headers={"Authorization": "Bearer " + "a" * size}
    )
    assert_problem(r, r.content, 431, "request_header_too_large")


def test_bearer_helper_still_signs_hs256(world: Any = None) -> None:
    header = bearer(tenant="t")["Authorization"].split(" ", 1)[1]
    assert jwt.get_unverified_header(header)["alg"] == "HS256"
