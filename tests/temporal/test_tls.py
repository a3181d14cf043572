"""Temporal beyond the dev server: every client connects through
``ductor_streams.temporal_connection`` (temporalio.envconfig: TEMPORAL_* variables, TOML
profiles, TLS, API keys), with DUCTOR_STREAMS_TEMPORAL_ADDRESS/_NAMESPACE winning.

The TLS endpoint is real: the session's Temporal dev server behind nginx on loopback,
with a CA and a server certificate for 127.0.0.1 made by openssl
(tests/support/temporal_tls.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from ductor_streams import temporal_connection
from ductor_streams.config import ConfigError, Settings
from ductor_streams.store import Store
from tests.support.server import free_port, settings_env
from tests.support.temporal_tls import Certificates, NginxGrpcTls, make_certificates
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.support import WorkersProcess, append_inputs, stream_ref
from tests.temporal.workflows import CollectInput, CollectResult, CollectWorkflow


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture(scope="module")
def tls_endpoint(
    certificates: Certificates, temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NginxGrpcTls]:
    """nginx terminating TLS for the session's Temporal dev server."""
    nginx = NginxGrpcTls(tmp_path_factory.mktemp("nginx"), certificates, temporal_address)
    nginx.start()
    try:
        yield nginx
    finally:
        nginx.stop()


@pytest.fixture
def no_temporal_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment names no Temporal, so a child sees only what the test
    gives it."""
    for name in list(os.environ):
        if name.startswith(("TEMPORAL_", "DUCTOR_STREAMS_TEMPORAL_")):
            monkeypatch.delenv(name)


def tls_environ(endpoint: NginxGrpcTls, ca: Path, **extra: str) -> dict[str, str]:
    """The standard variables of a TLS Temporal at ``endpoint`` trusting ``ca``."""
    return {
        "TEMPORAL_ADDRESS": endpoint.address,
        "TEMPORAL_NAMESPACE": "default",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca),
        **extra,
    }


async def system_info(settings: Settings) -> Client:
    """Connect with the module and make one call, within a deadline."""
    client = await asyncio.wait_for(temporal_connection.connect(settings), timeout=30)
    await client.workflow_service.get_system_info(GetSystemInfoRequest())
    return client


async def logged(endpoint: NginxGrpcTls, *needles: str) -> list[str]:
    """The access log lines holding every needle, once there is one (nginx writes a
    line when its request ends)."""

    async def matching() -> list[str]:
        return [line for line in endpoint.access_lines() if all(n in line for n in needles)]

    return await eventually(matching, bool, timeout=15, what=f"access log line with {needles}")


# -- 1 and 2: a real `workers` process delivers through TLS with an API key ------------


@pytest.mark.timeout(180)
async def test_workers_deliver_input_through_tls_with_only_standard_variables(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    tls_endpoint: NginxGrpcTls,
    certificates: Certificates,
    tmp_path: Path,
    no_temporal_env: None,
) -> None:
    api_key = f"dispatcher-key-{uuid.uuid4().hex}"
    env = {
        k: v
        for k, v in settings_env(wf_settings).items()
        if not k.startswith("DUCTOR_STREAMS_TEMPORAL_")
    }
    env.update(tls_environ(tls_endpoint, certificates.ca, TEMPORAL_API_KEY=api_key))
    workers = WorkersProcess(env, tmp_path / "workers.log")
    async with make_worker([CollectWorkflow]):
        handle = await wf_client.start_workflow(
            CollectWorkflow.run, CollectInput(expect=2), id=run_id, task_queue=task_queue
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        try:
            workers.start()
            await workers.started()
            await append_inputs(store, ref, [7, 8])
            result = await asyncio.wait_for(handle.result(), timeout=60)
        finally:
            workers.stop()
    assert result == CollectResult([1, 2], [7, 8], 1), workers.log_path.read_text()
    # The signals went through the TLS endpoint, each with the key as bearer metadata.
    lines = await logged(
        tls_endpoint, "/SignalWorkflowExecution", f'authorization="Bearer {api_key}"'
    )
    assert all(" 200 " in line for line in lines), lines


async def test_api_key_and_grpc_metadata_reach_the_server(
    tls_endpoint: NginxGrpcTls, certificates: Certificates
) -> None:
    api_key = f"client-key-{uuid.uuid4().hex}"
    settings = Settings(
        temporal_environ=tls_environ(
            tls_endpoint,
            certificates.ca,
            TEMPORAL_API_KEY=api_key,
            TEMPORAL_GRPC_META_X_DUCTOR_TEST="probe-1",
        )
    )
    await system_info(settings)
    lines = await logged(tls_endpoint, "/GetSystemInfo", f'authorization="Bearer {api_key}"')
    assert all('meta="probe-1"' in line for line in lines), lines


# -- 3: a TLS endpoint that does not check out is refused ------------------------------


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("wrong CA", "UnknownIssuer"),
        ("wrong server name", "wrong.example"),
        # nginx answers the h2 preface in HTTP/1 and hangs up: a frame error or a close.
        ("plaintext", "transport::Error"),
    ],
)
async def test_untrusted_or_plaintext_connections_fail(
    case: str, reason: str, tls_endpoint: NginxGrpcTls, certificates: Certificates
) -> None:
    # The endpoint works with the right settings (so a failure below is the case's).
    await system_info(Settings(temporal_environ=tls_environ(tls_endpoint, certificates.ca)))
    environ = {
        "wrong CA": tls_environ(tls_endpoint, certificates.wrong_ca),
        "wrong server name": tls_environ(
            tls_endpoint, certificates.ca, TEMPORAL_TLS_SERVER_NAME="wrong.example"
        ),
        "plaintext": {"TEMPORAL_ADDRESS": tls_endpoint.address, "TEMPORAL_TLS": "false"},
    }[case]
    settings = Settings(temporal_environ=environ)
    config = temporal_connection.connect_config(settings)
    assert config["target_host"] == tls_endpoint.address
    with pytest.raises(RuntimeError, match="Failed client connect") as raised:
        await system_info(settings)
    assert reason in str(raised.value)


# -- 4: precedence and profiles ---------------------------------------------------------


def test_project_variables_win_over_standard_ones() -> None:
    standard = {"TEMPORAL_ADDRESS": "standard:7233", "TEMPORAL_NAMESPACE": "standard-ns"}
    both = Settings(
        temporal_address="project:7233", temporal_namespace="project-ns", temporal_environ=standard
    )
    assert temporal_connection.connect_config(both) == {
        "target_host": "project:7233",
        "namespace": "project-ns",
    }
    # Each wins on its own; what the project leaves unset comes from TEMPORAL_*.
    address_only = Settings(temporal_address="project:7233", temporal_environ=standard)
    assert temporal_connection.connect_config(address_only) == {
        "target_host": "project:7233",
        "namespace": "standard-ns",
    }
    assert temporal_connection.connect_config(Settings(temporal_environ=standard)) == {
        "target_host": "standard:7233",
        "namespace": "standard-ns",
    }
    assert temporal_connection.connect_config(Settings(temporal_address="a:1")) == {
        "target_host": "a:1",
        "namespace": "default",
    }
    assert temporal_connection.configured_address(Settings()) is None
    # Empty counts as unset: an empty key turns no TLS on.
    empty = {"TEMPORAL_ADDRESS": "a:1", "TEMPORAL_API_KEY": "", "TEMPORAL_TLS": ""}
    assert temporal_connection.connect_config(Settings(temporal_environ=empty)) == {
        "target_host": "a:1",
        "namespace": "default",
    }
    with pytest.raises(ConfigError, match="no Temporal address"):
        temporal_connection.connect_config(Settings())


def write_profiles(path: Path, certificates: Certificates, address: str) -> Path:
    path.write_text(
        f"""
[profile.default]
address = "elsewhere:7233"

[profile.cloud]
address = "{address}"
namespace = "ns.acct"
api_key = "profile-key"

[profile.cloud.tls]
server_ca_cert_path = "{certificates.ca}"
server_name = "127.0.0.1"

[profile.cloud.grpc_meta]
x-ductor-test = "from-profile"
"""
    )
    return path


def test_toml_profile_gives_address_namespace_key_and_tls(
    tmp_path: Path, certificates: Certificates
) -> None:
    file = write_profiles(tmp_path / "temporal.toml", certificates, "ns.acct.tmprl.cloud:7233")
    environ = {"TEMPORAL_CONFIG_FILE": str(file), "TEMPORAL_PROFILE": "cloud"}
    config = temporal_connection.connect_config(Settings(temporal_environ=environ))
    tls = config.pop("tls")
    assert config == {
        "target_host": "ns.acct.tmprl.cloud:7233",
        "namespace": "ns.acct",
        "api_key": "profile-key",
        "rpc_metadata": {"x-ductor-test": "from-profile"},
    }
    assert tls.server_root_ca_cert == certificates.ca.read_bytes()
    assert tls.domain == "127.0.0.1"
    # Variables over the profile, the project's own over both.
    over = {**environ, "TEMPORAL_NAMESPACE": "env-ns", "TEMPORAL_API_KEY": "env-key"}
    config = temporal_connection.connect_config(
        Settings(temporal_address="project:7233", temporal_environ=over)
    )
    assert (config["target_host"], config["namespace"], config["api_key"]) == (
        "project:7233",
        "env-ns",
        "env-key",
    )
    # Without TEMPORAL_PROFILE, the file's default profile.
    default = Settings(temporal_environ={"TEMPORAL_CONFIG_FILE": str(file)})
    assert temporal_connection.configured_address(default) == "elsewhere:7233"


async def test_toml_profile_connects_through_tls(
    tmp_path: Path, certificates: Certificates, tls_endpoint: NginxGrpcTls
) -> None:
    file = write_profiles(tmp_path / "temporal.toml", certificates, tls_endpoint.address)
    environ = {
        "TEMPORAL_CONFIG_FILE": str(file),
        "TEMPORAL_PROFILE": "cloud",
        "TEMPORAL_NAMESPACE": "default",  # the dev server has no ns.acct
    }
    await system_info(Settings(temporal_environ=environ))
    await logged(tls_endpoint, "/GetSystemInfo", 'authorization="Bearer profile-key"')


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        (
            {"TEMPORAL_TLS_SERVER_CA_CERT_PATH": "/nonexistent/ca.pem"},
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
        ),
        ({"TEMPORAL_TLS_CLIENT_CERT_PATH": "/nonexistent/c.pem"}, "TEMPORAL_TLS_CLIENT_CERT_PATH"),
        ({"TEMPORAL_TLS": "yes"}, "TEMPORAL_TLS"),
        ({"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": "true"}, "DISABLE_HOST_VERIFICATION"),
        ({"TEMPORAL_PROFILE": "cloud"}, "TEMPORAL_PROFILE"),
        ({"TEMPORAL_CONFIG_FILE": "/nonexistent/t.toml"}, "TEMPORAL_CONFIG_FILE"),
    ],
)
def test_bad_settings_are_config_errors_naming_the_variable(
    environ: dict[str, str], names: str
) -> None:
    settings = Settings(temporal_environ={"TEMPORAL_ADDRESS": "a:1", **environ})
    with pytest.raises(ConfigError, match=names) as raised:
        temporal_connection.validate(settings)
    assert "\n" not in str(raised.value)


def test_bad_profile_file_is_a_config_error(tmp_path: Path, certificates: Certificates) -> None:
    file = write_profiles(tmp_path / "temporal.toml", certificates, "a:1")
    missing = {"TEMPORAL_CONFIG_FILE": str(file), "TEMPORAL_PROFILE": "nope"}
    with pytest.raises(ConfigError, match="TEMPORAL_PROFILE: Profile 'nope' not found"):
        temporal_connection.validate(Settings(temporal_environ=missing))
    # Strict: a misspelt key fails instead of being dropped.
    typo = tmp_path / "typo.toml"
    typo.write_text('[profile.default.tls]\nserver_ca_cert = "x"\n')
    with pytest.raises(ConfigError, match="TEMPORAL_CONFIG_FILE"):
        temporal_connection.validate(Settings(temporal_environ={"TEMPORAL_CONFIG_FILE": str(typo)}))


def test_workers_exit_2_on_a_bad_tls_file(settings: Settings, no_temporal_env: None) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")},
        "DUCTOR_STREAMS_DATABASE_URL": settings.database_url or "",
        "TEMPORAL_ADDRESS": "127.0.0.1:7233",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "/nonexistent/ca.pem",
    }
    done = subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", "workers"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "ductor-streams: TEMPORAL_TLS_SERVER_CA_CERT_PATH: cannot read /nonexistent/ca.pem"
        )
    ), done.stderr


# -- dev: a Temporal the environment names is used, with its TLS and key ---------------


def start_dev(env: dict[str, str], port: int, data_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    """`ductor-streams dev` with exactly ``env``, its output in ``out``."""
    args = ["dev", "--port", str(port), "--data-dir", str(data_dir)]
    with open(out, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ductor_streams.process.cli", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.timeout(120)
async def test_dev_uses_the_tls_temporal_the_environment_names(
    settings: Settings,
    tls_endpoint: NginxGrpcTls,
    certificates: Certificates,
    tmp_path: Path,
    no_temporal_env: None,
) -> None:
    api_key = f"dev-key-{uuid.uuid4().hex}"
    port = free_port()
    data_dir = tmp_path / "dev"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")},
        # The session's database, so that dev starts no Postgres either.
        "DUCTOR_STREAMS_DATABASE_URL": settings.database_url or "",
        "DUCTOR_STREAMS_TENANT": f"dev-tls-{uuid.uuid4().hex[:8]}",
        **tls_environ(tls_endpoint, certificates.ca, TEMPORAL_API_KEY=api_key),
    }
    out = tmp_path / "dev.out"
    process = start_dev(env, port, data_dir, out)
    try:

        async def printed() -> str:
            assert process.poll() is None, out.read_text()
            return out.read_text(errors="replace")

        text = await eventually(printed, lambda t: "Ctrl-C stops" in t, timeout=60, what="dev")
        assert f"Temporal  {tls_endpoint.address}\n" in text, text
        assert not (data_dir / "temporal.db").exists()  # no dev server of its own
        await logged(tls_endpoint, "/GetSystemInfo", f'authorization="Bearer {api_key}"')
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            rc = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert rc == 0, out.read_text()
