"""One address in front of several ``serve`` replicas: Debian's nginx as an HTTP load
balancer on loopback, configured as docs/deploy.md ("Load balancers in front of SSE")
says (HTTP/1.1 keep-alive to the replicas, buffering off, long read timeouts).

Round robin per request, and every answer says which replica gave it (``X-Upstream``,
nginx's ``$upstream_addr``), so that a test can tell that an append went through one
replica and a subscriber was served by the other. nginx runs in the foreground with its
config, pid, temporary and log files in a directory of its own.

nginx is installed from Debian when it is missing and this user may (root with
apt-get: scripts/test-tools lists it); otherwise the test fails with the install line.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.server import free_port
from tests.support.temporal_tls import INSTALL_NGINX, NGINX


def nginx_binary() -> str:
    """Debian's nginx, installed first when missing and root may; else the test fails."""
    found = NGINX if Path(NGINX).exists() else shutil.which("nginx")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["sh", "-c", INSTALL_NGINX], capture_output=True, timeout=600)
        found = NGINX if Path(NGINX).exists() else shutil.which("nginx")
    if found is None:
        pytest.fail(f"nginx is missing; the replica tests need it: {INSTALL_NGINX}", pytrace=False)
    return found


def balancer_config(root: Path, listen_port: int, upstreams: Sequence[str]) -> str:
    """nginx as an HTTP/1.1 load balancer over ``upstreams`` (host:port each)."""
    # As root, nginx would hand its worker to `nobody`, who may not enter the test's
    # private temporary directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    servers = "\n".join(f"        server {u};" for u in upstreams)
    return f"""{user}worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    log_format upstream '$request $status upstream=$upstream_addr';
    access_log {root}/access.log upstream;
    upstream replicas {{
{servers}
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{listen_port};
        client_max_body_size 0;
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_send_timeout 300s;
            # No retry of a request on the other replica: an append must go once.
            proxy_next_upstream off;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"""


class NginxBalancer:
    """nginx in the foreground, balancing ``upstreams`` behind ``url``."""

    def __init__(self, root: Path, upstreams: Sequence[str]) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.error_log = root / "error.log"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "nginx.conf"
        self.config.write_text(balancer_config(root, self.port, upstreams))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> NginxBalancer:
        """Start it and wait (with a deadline) until its port accepts connections."""
        binary = nginx_binary()
        output = open(self.root / "nginx.out", "ab")
        args = ["-c", str(self.config), "-p", str(self.root), "-e", str(self.error_log)]
        self.process = subprocess.Popen(
            [binary, *args, "-g", "daemon off;"], stdout=output, stderr=output
        )
        output.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"nginx exited with {self.process.returncode}: {self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                pass
            if time.monotonic() >= deadline:
                self.stop()
                raise AssertionError(f"nginx did not listen in {timeout}s: {self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        parts = [
            p.read_text(errors="replace")
            for p in (self.root / "nginx.out", self.error_log)
            if p.exists()
        ]
        return "\n".join(parts)[-4000:]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> NginxBalancer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
