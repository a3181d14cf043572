"""A real TLS endpoint in front of the Temporal dev server, on loopback.

``make_certificates`` makes, with openssl, a self-signed CA and a server certificate it
signs for IP 127.0.0.1 (and a second, unrelated CA: the "wrong" one). ``NginxGrpcTls``
runs Debian's nginx in the foreground as a TLS-terminating gRPC proxy (HTTP/2 with ALPN,
which stunnel lacks) to the dev server's plain port, with its own config, pid, temp
and log files in a temporary directory; its access log records each request's
``authorization`` header, so a test can see the API key arrive as gRPC metadata.

nginx is required, not optional: a missing one fails the test with the install line.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.server import free_port

NGINX = "/usr/sbin/nginx"
INSTALL_NGINX = "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx"


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA that signed the server certificate, the server's certificate
    and key, and an unrelated CA that must not be trusted for it."""

    ca: Path
    server_cert: Path
    server_key: Path
    wrong_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed_ca(directory: Path, name: str) -> None:
    # EC keys: quick to make. The CA extensions are explicit because rustls (under the
    # Temporal client) accepts only a CA certificate that says it is one.
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN=ductor-streams test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate for 127.0.0.1 signed by it, and a second CA."""
    directory.mkdir(parents=True, exist_ok=True)
    _self_signed_ca(directory, "ca")
    _self_signed_ca(directory, "wrong-ca")
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    return Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        wrong_ca=directory / "wrong-ca.pem",
    )


def nginx_binary() -> str:
    """Debian's nginx; fails the test (never skips it) when it is not installed."""
    found = NGINX if Path(NGINX).exists() else shutil.which("nginx")
    if found is None:
        pytest.fail(f"nginx is missing; the TLS tests need it: {INSTALL_NGINX}", pytrace=False)
    return found


def nginx_config(
    root: Path, certificates: Certificates, listen_port: int, upstream: str, running_as_root: bool
) -> str:
    """nginx as a TLS gRPC proxy: every path of its own under ``root``."""
    # As root, nginx would hand its worker to `nobody`, who may not enter the test's
    # private temporary directory.
    user = "user root;\n" if running_as_root else ""
    return f"""{user}worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    # $http_authorization: the gRPC metadata `authorization` (an API key's bearer);
    # $http_x_ductor_test: a TEMPORAL_GRPC_META_X_DUCTOR_TEST header.
    log_format grpc '$remote_addr "$request" $status '
                    'authorization="$http_authorization" meta="$http_x_ductor_test"';
    access_log {root}/access.log grpc;
    server {{
        listen 127.0.0.1:{listen_port} ssl http2;
        ssl_certificate {certificates.server_cert};
        ssl_certificate_key {certificates.server_key};
        # A worker's long polls and batches: no 1 MB body cap, no early idle close.
        client_max_body_size 0;
        keepalive_requests 100000;
        location / {{
            grpc_pass grpc://{upstream};
            grpc_read_timeout 300s;
            grpc_send_timeout 300s;
        }}
    }}
}}
"""


class NginxGrpcTls:
    """nginx in the foreground, terminating TLS for ``upstream`` (a plain gRPC address)."""

    def __init__(self, root: Path, certificates: Certificates, upstream: str) -> None:
        import os

        self.root = root
        self.certificates = certificates
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.access_log = root / "access.log"
        self.error_log = root / "error.log"
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "nginx.conf"
        self.config.write_text(
            nginx_config(root, certificates, self.port, upstream, os.geteuid() == 0)
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> NginxGrpcTls:
        """Start it and wait (with a deadline) until its port accepts connections."""
        binary = nginx_binary()
        output = open(self.root / "nginx.out", "ab")
        # -e: the error log before the config is read (not /var/log/nginx).
        args = ["-c", str(self.config), "-p", str(self.root), "-e", str(self.error_log)]
        self.process = subprocess.Popen(
            [binary, *args, "-g", "daemon off;"],
            stdout=output,
            stderr=output,
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
        """nginx's own output and error log, for a failure message."""
        parts = [
            path.read_text(errors="replace")
            for path in (self.root / "nginx.out", self.error_log)
            if path.exists()
        ]
        return "\n".join(parts)[-4000:]

    def access_lines(self) -> list[str]:
        if not self.access_log.exists():
            return []
        return self.access_log.read_text(errors="replace").splitlines()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
