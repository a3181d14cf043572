"""The settings object: every variable's bad value stops every command with exit 2 and one
line naming the variable; the documented table lists every variable; HOST/PORT reach
``serve``; ``--version`` prints the version."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ductor_streams.config import ConfigError, Settings
from ductor_streams.process.cli import main
from tests.support.server import free_port
from tests.temporal.polling import eventually

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

# One bad value for each variable (the field it sets in brackets where the name differs).
BAD_VALUES: dict[str, str] = {
    "DUCTOR_STREAMS_DATABASE_URL": "mysql://db/x",
    "DUCTOR_STREAMS_DIRECT_DATABASE_URL": "mysql://db/x",
    "DUCTOR_STREAMS_DATABASE_POOLER": "statement",
    "DUCTOR_STREAMS_JWT_SECRET": "too-short",
    "DUCTOR_STREAMS_REGION": "us east",
    "DUCTOR_STREAMS_OBJECT_STORE": "{not json",
    "DUCTOR_STREAMS_TENANT": "a tenant",
    "DUCTOR_STREAMS_TEMPORAL_ADDRESS": "no-port",
    "DUCTOR_STREAMS_TEMPORAL_NAMESPACE": "name space",
    "DUCTOR_STREAMS_HOST": "bad host",
    "DUCTOR_STREAMS_PORT": "eighty",
    "DUCTOR_STREAMS_POOL_MIN_SIZE": "-1",
    "DUCTOR_STREAMS_POOL_MAX_SIZE": "0",
    "DUCTOR_STREAMS_SHUTDOWN_TIMEOUT_SECONDS": "soon",
    "DUCTOR_STREAMS_LOG_LEVEL": "LOUD",
    "DUCTOR_STREAMS_CORS_ORIGINS": "https://app.example.com/",
    "DUCTOR_STREAMS_ACCESS_LOG": "sometimes",
    "DUCTOR_STREAMS_PUBLIC_URL": "https://streams.example.com/",
    "DUCTOR_STREAMS_TENANT_MAX_STREAMS": "0",
    "DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": "-1",
    "DUCTOR_STREAMS_HEAD_TIMEOUT_SECONDS": "0",
    "DUCTOR_STREAMS_MAX_HEADER_BYTES": "10",
    "DUCTOR_STREAMS_MAX_CONNECTIONS": "lots",
    "DUCTOR_STREAMS_TENANT_MAX_LIVE": "0",
    "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS": "60",
    "DUCTOR_STREAMS_SSE_BUFFER_RECORDS": "0",
    "DUCTOR_STREAMS_SSE_PAGE_RECORDS": "5000",
    "DUCTOR_STREAMS_LIVE_POLL_SECONDS": "0",
    "DUCTOR_STREAMS_SSE_BUFFER_BYTES": "1",
    "DUCTOR_STREAMS_SSE_STALL_SECONDS": "never",
    "DUCTOR_STREAMS_READ_STALL_SECONDS": "0",
    "DUCTOR_STREAMS_READ_PIECE_BYTES": "1024",
    "DUCTOR_STREAMS_TENANT_MAX_READS": "0",
    "DUCTOR_STREAMS_TENANT_READ_WAIT_SECONDS": "-1",
    "DUCTOR_STREAMS_DS_LONG_POLL_SECONDS": "0",
    "DUCTOR_STREAMS_DS_SSE_SECONDS": "forever",
    "DUCTOR_STREAMS_DELIVERY_LEASE_SECONDS": "0.01",
    "DUCTOR_STREAMS_DELIVERY_BATCH": "many",
    "DUCTOR_STREAMS_DELIVERY_STREAMS": "0",
    "DUCTOR_STREAMS_DELIVERY_OWNER": "x" * 201,
    "DUCTOR_STREAMS_MAINTENANCE_INTERVAL": "0",
    "DUCTOR_STREAMS_ORPHAN_SWEEP_INTERVAL": "-5",
    "DUCTOR_STREAMS_ORPHAN_GRACE": "an hour",
    "DUCTOR_STREAMS_OBJECT_INTENT_TTL": "forever",
    "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/key.json",
}


def _variable_names() -> set[str]:
    from ductor_streams.config import _env

    return {
        _env(name)
        for name in Settings.model_fields
        if name not in ("temporal_environ", "otel_environ")
    }


def test_every_variable_has_a_bad_value_case() -> None:
    # A new setting without a case here fails this test rather than go untested.
    assert set(BAD_VALUES) == _variable_names()


def test_the_documented_table_lists_every_variable() -> None:
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", DOCS.read_text(), re.M))
    assert _variable_names() <= documented
    assert (
        documented - _variable_names()
        <= {
            "TEMPORAL_ADDRESS",
            "TEMPORAL_NAMESPACE",
            "TEMPORAL_API_KEY",
            "TEMPORAL_PROFILE",
            "TEMPORAL_CONFIG_FILE",
            "TEMPORAL_TLS",
            "TEMPORAL_TLS_CLIENT_CERT_PATH",
            "TEMPORAL_TLS_CLIENT_KEY_PATH",
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
            "TEMPORAL_TLS_SERVER_NAME",
            "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION",
        }
        | OTEL_DOCUMENTED
    )


# The OpenTelemetry variables docs/configuration.md lists (foundation/tracing.py reads them).
OTEL_DOCUMENTED = {
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED",
}


def test_the_documented_table_lists_the_opentelemetry_variables() -> None:
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", DOCS.read_text(), re.M))
    assert documented >= OTEL_DOCUMENTED


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ],
)
def test_a_bad_opentelemetry_value_exits_2_naming_the_variable(
    variable: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["prune"]) == 2
    assert variable in capsys.readouterr().err


def test_tracing_is_off_unless_the_variables_configure_it() -> None:
    def exporters(**env: str) -> tuple[str, ...]:
        return Settings.from_env(env).trace_exporters

    assert exporters() == ()
    assert exporters(OTEL_SERVICE_NAME="x") == ()
    assert exporters(OTEL_TRACES_EXPORTER="none") == ()
    assert exporters(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318") == ("otlp",)
    assert exporters(OTEL_TRACES_EXPORTER="console,otlp") == ("console", "otlp")
    assert (
        exporters(
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4318",
            OTEL_SDK_DISABLED="true",
        )
        == ()
    )


@pytest.mark.parametrize("variable", sorted(BAD_VALUES))
@pytest.mark.parametrize("command", [["prune"], ["migrate"], ["serve"], ["workers"]])
def test_a_bad_value_exits_2_naming_the_variable(
    variable: str,
    command: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in _variable_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, BAD_VALUES[variable])
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"ductor-streams: {variable}"), err


def test_values_from_the_environment_are_parsed_and_views_built() -> None:
    settings = Settings.from_env(
        {
            "DUCTOR_STREAMS_PORT": "9001",
            "DUCTOR_STREAMS_HOST": "0.0.0.0",
            "DUCTOR_STREAMS_SSE_PAGE_RECORDS": "250",
            "DUCTOR_STREAMS_MAINTENANCE_INTERVAL": "7.5",
            "DUCTOR_STREAMS_DELIVERY_BATCH": "9",
            "DUCTOR_STREAMS_OBJECT_STORE": '{"local": "file:///tmp/x"}',
            "DUCTOR_STREAMS_REGION": "",  # empty counts as unset
            "TEMPORAL_API_KEY": "k",
            "UNRELATED": "y",
        }
    )
    assert (settings.host, settings.port, settings.region) == ("0.0.0.0", 9001, "local")
    assert settings.live.page_records == 250
    assert settings.upkeep.interval_seconds == 7.5
    assert settings.dispatcher_overrides() == {"per_stream": 9}
    assert dict(settings.object_stores) == {"local": "file:///tmp/x"}
    assert settings.temporal_environ == {"TEMPORAL_API_KEY": "k"}


def test_secrets_stay_out_of_repr() -> None:
    settings = Settings(
        database_url="postgresql://u:hunter2@db/x", jwt_secret="s" * 16 + "-secret-value"
    )
    assert "hunter2" not in repr(settings) and "secret-value" not in repr(settings)


def test_pool_sizes_are_checked_together() -> None:
    with pytest.raises(ConfigError, match="DUCTOR_STREAMS_POOL_MIN_SIZE"):
        Settings.from_env(
            {"DUCTOR_STREAMS_POOL_MIN_SIZE": "5", "DUCTOR_STREAMS_POOL_MAX_SIZE": "4"}
        )


def test_cli_overrides_are_validated_too() -> None:
    with pytest.raises(ConfigError, match="DUCTOR_STREAMS_PORT"):
        Settings().with_overrides(port=70000)


def test_version_prints_the_package_version() -> None:
    import importlib.metadata

    out = subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert out == f"ductor-streams {importlib.metadata.version('ductor-streams')}"


async def test_serve_listens_where_host_and_port_say(database_url: str) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DUCTOR_STREAMS_DATABASE_URL": database_url,
        "DUCTOR_STREAMS_JWT_SECRET": "x" * 32,
        "DUCTOR_STREAMS_HOST": "127.0.0.1",
        "DUCTOR_STREAMS_PORT": str(port),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ductor_streams.process.cli",
        "serve",
        "--no-workers",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient() as client:

            async def health() -> int:
                try:
                    answer = await client.get(f"http://127.0.0.1:{port}/healthz")
                except httpx.TransportError:
                    return 0
                return answer.status_code

            await eventually(health, lambda status: status == 200, timeout=30, what="healthz")
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def test_a_transaction_pooler_needs_a_direct_url_for_listen_and_the_migration_lock() -> None:
    pooled = "postgresql://u@pooler:6543/db"
    direct = "postgresql://u@db:5432/db"
    plain = Settings.from_env({"DUCTOR_STREAMS_DATABASE_URL": pooled})
    assert (plain.database_pooler, plain.transaction_pooled) == ("session", False)
    assert plain.require_session_database() == pooled
    transaction = Settings.from_env(
        {"DUCTOR_STREAMS_DATABASE_URL": pooled, "DUCTOR_STREAMS_DATABASE_POOLER": " Transaction "}
    )
    assert (transaction.database_pooler, transaction.transaction_pooled) == ("transaction", True)
    with pytest.raises(ConfigError, match=r"^DUCTOR_STREAMS_DIRECT_DATABASE_URL is not set"):
        transaction.require_session_database()
    with_direct = transaction.with_overrides(direct_database_url=direct)
    assert with_direct.require_session_database() == direct
    assert direct not in repr(with_direct)  # it may hold a password
