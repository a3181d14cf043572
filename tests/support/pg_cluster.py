"""A pg_auto_failover cluster on loopback: a monitor and two data nodes with a
synchronous standby, for failover tests (tests/production/test_ha_failover.py) and the
failover benchmark (bench/failover.py).

Debian's ``postgresql-15-auto-failover`` and ``pg-auto-failover-cli`` (``pg_autoctl``),
installed here when missing and the process may (root with apt-get; .ci/run installs
them too). Each node is a ``pg_autoctl run`` process (its keeper: it starts and watches
its Postgres and reports to the monitor) in a folder of its own under one temporary
folder. Postgres refuses to run as root, so when the tests do, everything belongs to
and runs as an unprivileged user (as tests/support/cluster.py does).

With two data nodes and ``number_sync_standbys`` at its default (0), pg_auto_failover
makes the standby synchronous (``synchronous_standby_names = 'ANY 1 (...)'``) while it
is healthy: a commit the primary acknowledged is on the standby too.

The monitor's health checks are made fast (``FAST_MONITOR``), so that a dead primary is
noticed in about a second instead of about 30 s: its defaults suit real networks. The
keepers' ``network_partition_timeout`` stays below the monitor's
``primary_demote_timeout``, as pg_auto_failover requires: a primary cut off from the
monitor and its standby demotes itself before the monitor promotes the standby.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cluster import _run_as
from tests.support.server import free_port

PACKAGES = ("postgresql-15-auto-failover", "pg-auto-failover-cli")
INSTALL = "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q " + " ".join(
    PACKAGES
)
DATABASE = "ductor"
FORMATION = "default"

# The monitor's settings (pgautofailover.*), in milliseconds: a health check every
# second that gives up after one retry, a node unhealthy after 2 s without a report, and
# 3 s for a primary that went silent to demote itself before its standby is promoted.
FAST_MONITOR = {
    "health_check_period": 1000,
    "health_check_timeout": 1000,
    "health_check_max_retries": 1,
    "health_check_retry_delay": 500,
    "node_considered_unhealthy_timeout": 2000,
    "primary_demote_timeout": 3000,
}
# Each keeper's: a primary that can reach neither the monitor nor its standby for this
# many seconds demotes itself (below primary_demote_timeout, in seconds).
NETWORK_PARTITION_TIMEOUT_SECONDS = 2


def pg_bin_dir() -> Path:
    """Postgres's binaries (``pg_config --bindir``): pg_autoctl runs ``pg_ctl`` from there."""
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def ensure_pg_auto_failover() -> str:
    """``pg_autoctl``'s path; installs the Debian packages first when they are missing
    and this process may (root, apt-get). Raises RuntimeError with the install line
    otherwise."""
    extension = Path("/usr/share/postgresql/15/extension/pgautofailover.control")
    found = shutil.which("pg_autoctl")
    if found and extension.exists():
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", *PACKAGES]
        if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            subprocess.run(install, env=env, capture_output=True, check=False)
        found = shutil.which("pg_autoctl")
        if found and extension.exists():
            return found
    raise RuntimeError(f"pg_auto_failover is missing: {INSTALL}")


@dataclass
class Node:
    """One pg_autoctl-managed Postgres (the monitor is one too)."""

    name: str
    port: int
    pgdata: Path
    log: Path
    keeper: subprocess.Popen[bytes] | None = None
    frozen: bool = False  # its keeper was stopped (SIGSTOP) by ``kill_primary``

    def dsn(self, database: str = DATABASE) -> str:
        """Straight to this node, whatever its role."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def keeper_pids(self) -> list[int]:
        """The keeper and its service processes (not Postgres)."""
        if self.keeper is None or self.keeper.poll() is not None:
            return []
        return [self.keeper.pid, *_children(self.keeper.pid, "pg_autoctl")]


def _children(pid: int, named: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # The command may hold spaces: the parent pid is the second field after it.
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid and cmdline.startswith(named.encode()):
            found.append(int(entry.name))
    return found


@dataclass
class AutoFailoverCluster:
    """``start()``, then ``dsn()`` (the multi-host URI), ``primary()``, ``switchover()``,
    ``kill_primary()``, ``wait_states(...)``; ``destroy()`` at the end."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ductor-paf-")))
    user: str | None = field(default_factory=_run_as)
    monitor: Node = field(init=False)
    nodes: list[Node] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.pg_autoctl = ensure_pg_auto_failover()
        self.bin_dir = pg_bin_dir()
        self.monitor = self._node("monitor")
        self.nodes = [self._node("node1"), self._node("node2")]

    def _node(self, name: str) -> Node:
        return Node(name, free_port(), self.root / name, self.root / f"{name}.log")

    # -- building ---------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> AutoFailoverCluster:
        """Monitor, then the first node (it becomes the primary), then the second (a
        base backup of the first, its synchronous standby); returns when both report
        their state."""
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        (self.root / "home").mkdir()
        if self.user is not None:
            os.chown(self.root / "home", entry.pw_uid, entry.pw_gid)
        deadline = time.monotonic() + timeout
        # initdb without its fsync (seconds on a busy disk): pg_autoctl takes over an
        # existing data folder. The second node is a base backup of the first.
        for node in (self.monitor, self.nodes[0]):
            self._command(
                [str(self.bin_dir / "initdb"), "--no-sync", "--auth=trust", "--encoding=UTF8",
                 "-D", str(node.pgdata)],
                120,
            )  # fmt: skip
        self._autoctl(
            "create", "monitor", "--pgdata", str(self.monitor.pgdata),
            "--pgport", str(self.monitor.port), "--pgctl", str(self.bin_dir / "pg_ctl"),
            "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
        )  # fmt: skip
        # Loopback only (pg_autoctl makes the monitor listen on every address).
        self._autoctl(
            "config", "set", "--pgdata", str(self.monitor.pgdata),
            "postgresql.listen_addresses", "127.0.0.1",
        )  # fmt: skip
        self._run(self.monitor)
        self._wait(lambda: self._monitor_sql("SELECT 1") == "1", deadline, "the monitor")
        for name, value in FAST_MONITOR.items():
            self._monitor_sql(f"ALTER SYSTEM SET pgautofailover.{name} = {value}")
        self._monitor_sql("SELECT pg_reload_conf()")
        for index, node in enumerate(self.nodes):
            self._autoctl(
                "create", "postgres", "--pgdata", str(node.pgdata),
                "--pgport", str(node.port), "--pgctl", str(self.bin_dir / "pg_ctl"),
                "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--name", node.name,
                "--dbname", DATABASE, "--monitor", self.monitor_uri(),
                "--auth", "trust", "--no-ssl",
            )  # fmt: skip
            self._autoctl(
                "config", "set", "--pgdata", str(node.pgdata),
                "timeout.network_partition_timeout", str(NETWORK_PARTITION_TIMEOUT_SECONDS),
            )  # fmt: skip
            self._run(node)
            wanted = (
                {"node1": "single"} if index == 0 else {"node1": "primary", "node2": "secondary"}
            )
            self.wait_states(wanted, timeout=max(1.0, deadline - time.monotonic()))
        return self

    def _run(self, node: Node) -> None:
        output = open(node.log, "ab")
        node.keeper = subprocess.Popen(
            [self.pg_autoctl, "run", "--pgdata", str(node.pgdata)],
            user=self.user,
            cwd=self.root,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the tests reaches it through destroy()
        )
        output.close()

    # -- reading ----------------------------------------------------------------------

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def dsn(self) -> str:
        """What ``pg_autoctl show uri --formation default`` prints (every data node, with
        ``target_session_attrs=read-write``), with the user the tests connect as."""
        uri = self._autoctl(
            "show", "uri", "--pgdata", str(self.monitor.pgdata), "--formation", FORMATION
        ).strip()
        scheme, _, rest = uri.partition("://")
        return f"{scheme}://postgres@{rest}"

    def states(self) -> dict[str, tuple[str, str]]:
        """``{node name: (reported state, assigned state)}`` as the monitor has them."""
        out = self._autoctl("show", "state", "--pgdata", str(self.monitor.pgdata), "--json")
        return {
            n["nodename"]: (n["current_group_state"], n["assigned_group_state"])
            for n in json.loads(out)
        }

    def settings(self) -> dict[str, str]:
        """The formation's replication settings as ``pg_autoctl show settings`` prints
        them: ``number_sync_standbys`` and the primary's ``synchronous_standby_names``."""
        out = self._autoctl("show", "settings", "--pgdata", str(self.monitor.pgdata), "--json")
        found: dict[str, str] = {}
        for entry in _settings_entries(json.loads(out)):
            found[entry["setting"]] = str(entry["value"])
        return found

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def primary(self) -> Node:
        """The node the monitor has as primary (reported and assigned)."""
        for name, (reported, goal) in self.states().items():
            if reported == goal and reported in ("primary", "wait_primary", "single"):
                return self.node(name)
        raise RuntimeError(f"no primary: {self.states()}")

    def standby(self) -> Node:
        primary = self.primary()
        return next(n for n in self.nodes if n is not primary)

    def wait_states(self, wanted: dict[str, str], timeout: float = 60.0) -> None:
        """Until each named node has reported, and been assigned, its wanted state."""
        deadline = time.monotonic() + timeout

        def reached() -> bool:
            try:
                states = self.states()
            except (RuntimeError, ValueError):
                return False  # the monitor busy or between answers
            return all(states.get(name) == (state, state) for name, state in wanted.items())

        self._wait(reached, deadline, f"states {wanted}")

    def wait_stable(self, timeout: float = 60.0) -> None:
        """Until one node is primary and the other its secondary again."""
        deadline = time.monotonic() + timeout

        def stable() -> bool:
            try:
                found = sorted(state for state, goal in self.states().values() if state == goal)
            except (RuntimeError, ValueError):
                return False
            return found == ["primary", "secondary"]

        self._wait(stable, deadline, "a primary and its secondary")

    # -- faults -----------------------------------------------------------------------

    def switchover(self) -> None:
        """A planned switchover (``pg_autoctl perform switchover``): returns once the
        monitor reports it done."""
        self._autoctl(
            "perform", "switchover", "--pgdata", str(self.monitor.pgdata),
            "--formation", FORMATION, timeout=120,
        )  # fmt: skip

    def kill_primary(self) -> Node:
        """An unplanned failover: the primary's keeper is stopped (SIGSTOP: it neither
        restarts its Postgres nor reports to the monitor, as on a machine that hung),
        then its postmaster is SIGKILLed; the monitor notices and promotes the standby.
        Returns the killed node (it stays down until ``destroy``)."""
        node = self.primary()
        pid = node.postmaster_pid()
        assert pid is not None, f"{node.name} has no postmaster"
        for keeper in node.keeper_pids():
            os.kill(keeper, signal.SIGSTOP)
        node.frozen = True
        os.kill(pid, signal.SIGKILL)
        return node

    # -- teardown ---------------------------------------------------------------------

    def destroy(self) -> None:
        """Stop every keeper (each stops its Postgres) and remove the folder."""
        nodes = [*self.nodes, self.monitor]
        for node in nodes:  # all at once: each takes a second or two
            self._ask_to_stop(node)
        for node in nodes:
            self._wait_stopped(node)
        shutil.rmtree(self.root, ignore_errors=True)

    def _ask_to_stop(self, node: Node) -> None:
        keeper = node.keeper
        if keeper is None or keeper.poll() is not None:
            return
        if node.frozen:
            # Its postmaster was killed and is a zombie of its stopped parent: with the
            # pid file gone its keeper's `pg_ctl stop` finds nothing to wait for. The
            # SIGTERM is pending when it resumes, so it exits at once (and removes its
            # semaphore, which a SIGKILLed keeper would leave behind).
            pids = node.keeper_pids()
            (node.pgdata / "postmaster.pid").unlink(missing_ok=True)
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            for pid in pids:
                _signal(pid, signal.SIGCONT)
        else:
            _signal(keeper.pid, signal.SIGTERM)

    def _wait_stopped(self, node: Node) -> None:
        keeper = node.keeper
        if keeper is not None:
            try:
                keeper.wait(60)
            except subprocess.TimeoutExpired:
                for pid in node.keeper_pids():
                    _signal(pid, signal.SIGKILL)
                keeper.wait(10)
        # Whatever Postgres outlived its keeper (none, normally).
        postmaster = node.postmaster_pid()
        if postmaster is not None and _alive(postmaster):
            if _is_postmaster_of(postmaster, node.pgdata):
                _signal(postmaster, signal.SIGKILL)

    # -- plumbing ---------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        home = self.root / "home"
        return {
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            # Postgres's sockets (pg_autoctl's -k) and libpq's default host: this folder,
            # not /var/run/postgresql.
            "PG_REGRESS_SOCK_DIR": str(self.root),
            "PGHOST": str(self.root),
            "LANG": "C.UTF-8",
        }

    def _autoctl(self, *args: str, timeout: float = 120) -> str:
        return self._command([self.pg_autoctl, *args], timeout)

    def _monitor_sql(self, sql: str) -> str:
        return self._command(
            [str(self.bin_dir / "psql"), "-X", "-A", "-t", "-p", str(self.monitor.port),
             "-d", "pg_auto_failover", "-v", "ON_ERROR_STOP=1", "-c", sql],
            30,
        ).strip()  # fmt: skip

    def _command(self, argv: list[str], timeout: float) -> str:
        # Output to files, not pipes: a Postgres it starts could hold a pipe open. Its
        # answer is on stdout, its log lines on stderr.
        with tempfile.TemporaryFile("w+") as output, tempfile.TemporaryFile("w+") as log:
            result = subprocess.run(
                argv,
                user=self.user,
                cwd=self.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=log,
                timeout=timeout,
            )
            output.seek(0)
            log.seek(0)
            text = output.read()
            if result.returncode != 0:
                said = (text + log.read())[-2000:]
                raise RuntimeError(f"{' '.join(argv[:3])} failed ({result.returncode}): {said}")
        return text

    @staticmethod
    def _wait(check: Any, deadline: float, what: str) -> None:
        while True:
            try:
                if check():
                    return
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"pg_auto_failover: timed out waiting for {what}")
            time.sleep(0.1)


def _settings_entries(found: Any) -> list[dict[str, Any]]:
    # `show settings --json` nests the entries by context (formation, primary, node).
    if isinstance(found, list):
        return [e for item in found for e in _settings_entries(item)]
    if isinstance(found, dict):
        if "setting" in found and "value" in found:
            return [found]
        return [e for value in found.values() for e in _settings_entries(value)]
    return []


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _is_postmaster_of(pid: int, pgdata: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(pgdata).encode() in cmdline
