"""The ductor-streams command: token, migrate, configuration errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys

from ductor_streams.auth import verify_token
from tests.conftest import JWT_SECRET


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    return subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_prints_a_verifiable_token_alone():
    result = run_cli(
        "token",
        "--sub",
        "app",
        "--tenant",
        "acme",
        "--scope",
        "streams:read",
        "--scope",
        "streams:write",
        "--run",
        "r1",
        "--run",
        "r2",
        "--region",
        "eu",
        "--ttl",
        "60",
        env={"DUCTOR_STREAMS_JWT_SECRET": JWT_SECRET},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    principal = verify_token(JWT_SECRET, lines[0])
    assert principal.sub == "app" and principal.tenant == "acme"
    assert principal.scopes == {"streams:read", "streams:write"}
    assert principal.runs == {"r1", "r2"} and principal.region == "eu"


def test_missing_configuration_exits_2_with_one_line():
    for args in (
        ["token", "--sub", "a", "--tenant", "t", "--scope", "streams:read", "--run", "r"],
        ["migrate"],
        ["serve", "--no-workers"],
    ):
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("ductor-streams: DUCTOR_STREAMS_")


def test_bad_object_store_setting_exits_2():
    result = run_cli("migrate", env={"DUCTOR_STREAMS_OBJECT_STORE": "{not json"})
    assert result.returncode == 2
    assert "DUCTOR_STREAMS_OBJECT_STORE" in result.stderr


def test_bad_usage_exits_2():
    assert run_cli("no-such-command").returncode == 2
    assert run_cli("token", "--sub", "a").returncode == 2


def test_migrate_on_current_database_says_so(database_url):
    result = run_cli("migrate", env={"DUCTOR_STREAMS_DATABASE_URL": database_url})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "migrations are current"
