"""Debian's PgBouncer (1.18) in front of a Postgres server, on a free loopback port.

``PgBouncer(server_dsn, mode="transaction").start()`` writes a ``pgbouncer.ini`` into a
folder of its own (every database name is passed through to the server named by
``server_dsn``, as that DSN's user, so a client may name any database; ``auth_type =
trust``), runs ``pgbouncer`` in the foreground and waits, with a deadline, until its
port accepts connections. ``dsn(database)`` is a client DSN through it. PgBouncer
refuses to run as root: as root it runs as ``postgres`` (or ``nobody``), which owns the
folder. The Debian package is installed when the binary is missing (as the TLS tests'
nginx is not: this one the fixture can fetch itself).

1.18 has no tracking of protocol-level prepared statements (``max_prepared_statements``
arrived in 1.21): in transaction mode a named prepared statement fails as soon as two
clients share a server connection, which is the point of testing against it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.support.server import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"
INSTALL = ["apt-get", "install", "-y", "-q", "pgbouncer"]


def pgbouncer_binary() -> str:
    """PgBouncer's binary, installing Debian's package first when it is missing."""
    found = PGBOUNCER if Path(PGBOUNCER).exists() else shutil.which("pgbouncer")
    if found is not None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(INSTALL, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(INSTALL, env=env, capture_output=True, check=True)
    found = PGBOUNCER if Path(PGBOUNCER).exists() else shutil.which("pgbouncer")
    if found is None:
        raise RuntimeError("pgbouncer is missing and `apt-get install pgbouncer` did not help")
    return found


def _run_as() -> str | None:
    """The unprivileged user PgBouncer runs as when the tests run as root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("no unprivileged user (postgres, nobody) to run pgbouncer as")


def _quote(value: str) -> str:
    """A value in a ``[databases]`` connection string (libpq quoting)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PgBouncer:
    """One PgBouncer process; ``mode`` is its ``pool_mode`` (``transaction`` or
    ``session``), ``pool_size`` its server connections per database and user."""

    def __init__(self, server_dsn: str, *, mode: str = "transaction", pool_size: int = 20) -> None:
        parts = urlsplit(server_dsn)
        # The embedded Postgres is reached on a Unix socket: its DSN names the socket's
        # folder as ``?host=`` (PgBouncer takes a folder as its host too).
        socket_dir = dict(parse_qsl(parts.query)).get("host")
        self.server_host = parts.hostname or socket_dir or "127.0.0.1"
        self.server_port = parts.port or 5432
        self.user = unquote(parts.username or "postgres")
        self.password = unquote(parts.password) if parts.password else None
        self.mode = mode
        self.pool_size = pool_size
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ductor-pgbouncer-"))
        self.config = self.root / "pgbouncer.ini"
        self.log = self.root / "pgbouncer.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.run_as = _run_as()
        if socket_dir and not parts.hostname and os.geteuid() == 0:
            # The embedded Postgres's socket folder is its own user's alone (0700):
            # PgBouncer runs as that user to reach it.
            self.run_as = pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name

    def dsn(self, database: str) -> str:
        """A client DSN for ``database`` through this PgBouncer."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def write_config(self) -> None:
        server = f"host={self.server_host} port={self.server_port} user={_quote(self.user)}"
        if self.password:
            server += f" password={_quote(self.password)}"
        self.config.write_text(
            f"""[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.root}/userlist.txt
admin_users = {self.user}
pool_mode = {self.mode}
default_pool_size = {self.pool_size}
max_client_conn = 1000
max_db_connections = 0
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits
logfile = {self.log}
pidfile = {self.root}/pgbouncer.pid
log_connections = 0
log_disconnections = 0
"""
        )
        # trust still needs the user to be listed.
        (self.root / "userlist.txt").write_text(f'"{self.user}" ""\n')
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 20.0) -> PgBouncer:
        """Start it and wait (with a deadline) until its port accepts connections."""
        binary = pgbouncer_binary()
        self.write_config()
        output = open(self.root / "pgbouncer.out", "ab")
        self.process = subprocess.Popen(
            [binary, str(self.config)],
            user=self.run_as,
            cwd=self.root,
            stdout=output,
            stderr=output,
            stdin=subprocess.DEVNULL,
        )
        output.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer exited with {self.process.returncode}: {self.logs()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not listen in {timeout}s: {self.logs()}")
            time.sleep(0.05)

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW <what>`` on PgBouncer's admin console (``STATS``, ``POOLS``, ``CONFIG``),
        through psql: the console speaks only the simple query protocol."""
        out = subprocess.run(
            ["psql", "-X", "-A", "-F", "\t", "-P", "footer=off", "-c", f"SHOW {what}"],
            env={
                **os.environ,
                "PGHOST": "127.0.0.1",
                "PGPORT": str(self.port),
                "PGUSER": self.user,
                "PGDATABASE": "pgbouncer",
            },
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.splitlines()
        header = out[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=False)) for line in out[1:]]

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has passed to Postgres for ``database`` so far."""
        rows = [r for r in self.show("STATS") if r.get("database") == database]
        return sum(int(r["total_xact_count"]) for r in rows)

    def logs(self) -> str:
        """PgBouncer's output and log file, for a failure message."""
        parts = [
            path.read_text(errors="replace")
            for path in (self.root / "pgbouncer.out", self.log)
            if path.exists()
        ]
        return "\n".join(parts)[-4000:]

    def stop(self) -> None:
        """SIGTERM: 1.18's immediate shutdown (SIGINT would wait for its clients)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
