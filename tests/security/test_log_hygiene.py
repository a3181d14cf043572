"""Log hygiene: a unique marker placed in payloads (and in rejected bodies, headers
and IDs), the bearer token and the signing secret never appear in logs at any level:
in-process (every record at DEBUG, formatted with tracebacks) and in the stderr of a
real server subprocess running at DEBUG. Structured lines about a stream carry its
metadata and pinned ``log_region``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_streams.foundation.logs import JsonFormatter
from tests.conftest import JWT_SECRET
from tests.security.tour import tour
from tests.security.world import World
from tests.support.server import ServerProcess, settings_env


class _Capture(logging.Handler):
    """Every record, formatted both as the product's JSON line and as plain text with
    its arguments and traceback (what any other handler could print)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []
        self._json = JsonFormatter()
        self._plain = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self._json.format(record))
        text = self._plain.format(record)
        if record.exc_info:
            text += "\n" + self._plain.formatException(record.exc_info)
        self.lines.append(f"{text} {record.args!r} {record.__dict__!r}")


@pytest.fixture
def captured() -> Iterator[_Capture]:
    root = logging.getLogger()
    handler = _Capture()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _secrets(world: World) -> list[str]:
    token = world.admin["Authorization"].split(" ", 1)[1]
    return [world.secret_marker, world.open_marker, token, JWT_SECRET]


async def test_no_payload_token_or_secret_in_in_process_logs(
    client: Any, captured: _Capture
) -> None:
    world = await World(client).setup()
    sent = await tour(world)
    assert sent > 20
    logged = "\n".join(captured.lines)
    assert "stream access" in logged  # DEBUG lines were produced and captured
    for secret in _secrets(world):
        assert secret not in logged, f"{secret[:12]}... leaked into the logs"
    accesses = [
        json.loads(line)
        for line in captured.lines
        if line.startswith("{") and '"message":"stream access"' in line
    ]
    assert accesses
    for entry in accesses:
        assert entry["tenant"] == world.tenant and entry["run_id"] == world.run_id
        assert entry["log_region"] == "local" and entry["stream_id"]


async def test_no_payload_token_or_secret_in_a_debug_server_log(
    settings: Any, tmp_path: Path
) -> None:
    log_path = tmp_path / "server.log"
    with ServerProcess(
        settings, log_path=log_path, extra_env={"DUCTOR_STREAMS_LOG_LEVEL": "DEBUG"}
    ) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            world = await World(http).setup()
            sent = await tour(world)
    # The server has stopped: everything it wrote is in the file.
    logged = log_path.read_text(encoding="utf-8", errors="replace")
    assert sent > 20
    assert '"message":"stream access"' in logged  # it really ran at DEBUG
    for secret in _secrets(world):
        assert secret not in logged, f"{secret[:12]}... leaked into the server's log"
    for line in logged.splitlines():
        if '"message":"stream access"' in line:
            entry = json.loads(line)
            assert entry["log_region"] == "local" and entry["tenant"] == world.tenant


def test_settings_never_show_the_secret_or_the_dsn(settings: Any) -> None:
    text = repr(settings) + str(settings)
    assert settings.jwt_secret and settings.jwt_secret not in text
    assert settings.database_url and settings.database_url not in text


async def test_unauthenticated_root_routes_hold_no_tenant_data(world: World) -> None:
    await tour(world)
    for path in ("/metrics", "/healthz", "/readyz", "/schema/openapi.json"):
        r = await world.http.get(path)
        assert r.status_code == 200, (path, r.status_code)
        for secret in [*_secrets(world), world.run_id, world.tenant, world.stream_id]:
            assert secret not in r.text, (path, secret[:12])


async def test_the_outbox_cli_never_prints_payloads(world: World, settings: Any) -> None:
    delivery = await world.delivery_id()
    env = {**os.environ, **settings_env(settings)}
    for args in (
        ["list", "--run", world.run_id, "--json"],
        ["list", "--run", world.run_id],
        ["show", delivery, "--json"],
        ["show", delivery],
        ["summary", "--json"],
    ):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ductor_streams.process.cli",
            "outbox",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        raw_out, raw_err = await asyncio.wait_for(process.communicate(), timeout=60)
        out, err = raw_out.decode(), raw_err.decode()
        assert process.returncode == 0, (args, err[-500:])
        assert world.run_id in out or args[0] == "summary", (args, out[:300])
        for secret in _secrets(world):
            assert secret not in out + err, (args, secret[:12])
