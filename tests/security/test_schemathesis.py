"""A bounded schemathesis run against the real server's OpenAPI document
(``/schema/openapi.json``): no 5xx, and every answer conforms to the document (status,
content type, body schema, headers). Twice: with generated path IDs (mostly unknown
streams) and with the IDs pinned to a real stream, so generated bodies reach the
store. Server-Sent Events are left out (an open stream never ends; tests/live covers it).
"""

from __future__ import annotations

import hashlib
import secrets
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ductor_streams.auth import SCOPES, issue_token
from tests.conftest import API, JWT_SECRET

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
MAX_EXAMPLES = 30
CONFIG = Path(__file__).with_name("schemathesis.toml")
TENANT = f"t-st-{secrets.token_hex(4)}"
RUN = f"run-st-{secrets.token_hex(4)}"
STREAM = "st-stream"


def _headers() -> dict[str, str]:
    token = issue_token(JWT_SECRET, sub="fuzzer", tenant=TENANT, scopes=list(SCOPES), runs=["*"])
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def pinned_stream(server: Any) -> dict[str, str]:
    """A real input stream (so deliveries exist) with a consumer and a few records."""
    base = f"{server.url}{API}/runs/{RUN}/streams"
    definition = {"stream_id": STREAM, "direction": "input", "consumers": ["c1"]}
    r = httpx.post(base, json=definition, headers=_headers())
    assert r.status_code == 201, r.text
    r = httpx.post(
        f"{base}/{STREAM}/records",
        json={"records": [{"payload": {"n": i}} for i in range(3)]},
        headers=_headers(),
    )
    assert r.status_code == 201, r.text
    data = b"fuzzed object"
    r = httpx.post(
        f"{base}/{STREAM}/objects",
        json={
            "idempotency_key": "fuzz",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        },
        headers=_headers(),
    )
    assert r.status_code == 201, r.text
    object_id = r.json()["object_id"]
    r = httpx.get(f"{server.url}{API}/ops/deliveries", params={"run": RUN}, headers=_headers())
    assert r.status_code == 200, r.text
    delivery_id = str(r.json()["deliveries"][0]["delivery_id"])
    return {
        "run_id": RUN,
        "stream_id": STREAM,
        "consumer_id": "c1",
        "object_id": object_id,
        "delivery_id": delivery_id,
    }


def _load(server: Any) -> Any:
    # The per-operation statuses of tests/security/schemathesis.toml (each with its
    # reason) apply here too.
    with CONFIG.open("rb") as f:
        data = tomllib.load(f)
    data.pop("phases", None)
    config = schemathesis.Config.from_dict({**data, "base-url": server.url, "headers": _headers()})
    schema = schemathesis.openapi.from_url(server.url + "/schema/openapi.json", config=config)
    return schema.exclude(path_regex=r"/subscribe$")


_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _fuzz(server: Any, pinned: dict[str, str] | None) -> tuple[int, list[str]]:
    """Run every operation in both generation modes; return (operations, failures).

    With pinned IDs, ``close`` is left out: it would end the real stream for the rest.
    """
    schema = _load(server)
    if pinned:
        schema = schema.exclude(path_regex=r"/close$")
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        names = {p.name for p in operation.path_parameters}
        path_parameters = {k: v for k, v in (pinned or {}).items() if k in names} or None
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

            @given(case=strategy)
            @_SETTINGS
            def run(case: Any) -> None:
                case.call_and_validate(headers=_headers(), checks=CHECKS)

            try:
                run()
            except Unsatisfiable:
                # Nothing to make invalid (no parameters, no body): only positive cases.
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # one report for all operations
                failures.append(f"{operation.label} [{mode.value}]: {exc}"[:3000])
    return operations, failures


def test_openapi_with_generated_ids(server: Any) -> None:
    operations, failures = _fuzz(server, None)
    assert operations >= 15
    assert not failures, "\n\n".join(failures)


def test_openapi_with_a_real_stream(server: Any, pinned_stream: dict[str, str]) -> None:
    operations, failures = _fuzz(server, pinned_stream)
    assert operations >= 14
    assert not failures, "\n\n".join(failures)
    # The generated requests reached the real stream: some appends were accepted.
    r = httpx.get(f"{server.url}{API}/runs/{RUN}/streams/{STREAM}", headers=_headers())
    assert r.status_code == 200, r.text
    assert r.json()["state"]["total_items"] > 3, r.json()
