"""Benchmark: upload + commit of a 32 MiB object through a real server, against writing
the same bytes to the same store directly, in the same run.

    python -m bench.objects [--store local|gcs] [--size-mib 32] [--runs 5]
                            [--database-url postgresql://...]

Reports MB/s (1 MB = 10^6 bytes) for both, and the server process's RSS before the
uploads and its peak during them (sampled every 2 ms with psutil). The database is a fresh
one created on the given server (default: $DUCTOR_STREAMS_DATABASE_URL, else
$DUCTOR_STREAMS_TEST_DATABASE_URL) and dropped afterwards. ``--store gcs`` runs
gcp-storage-emulator in this process, so its figures measure the emulator as much as us.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.environment import HTTP_LIMITS
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.postgres import create_database, drop_database
from tests.support.server import ServerProcess, free_port

API = "/api/workflow-streams"
MiB = 1024 * 1024


class PeakRss:
    """Samples a process's resident set size in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int, interval: float = 0.002) -> None:
        self._process = psutil.Process(pid)
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def current(self) -> int:
        return int(self._process.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.current())
            except psutil.NoSuchProcess:
                return
            time.sleep(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _token(secret: str) -> str:
    from ductor_streams.auth import SCOPES, issue_token

    return issue_token(secret, sub="bench", tenant="bench", scopes=list(SCOPES), runs=["*"])


async def _upload_commit(
    http: httpx.AsyncClient, base: str, data: bytes, digest: str, *, phases: bool = False
) -> float:
    started = time.perf_counter()
    prepared = await http.post(
        f"{base}/objects",
        json={
            "idempotency_key": secrets.token_hex(8),
            "sha256": digest,
            "size": len(data),
            "content_type": "application/octet-stream",
            "metadata": {"bench": True},
        },
    )
    prepared.raise_for_status()
    object_id = prepared.json()["object_id"]
    put_started = time.perf_counter()
    (await http.put(f"{base}/objects/{object_id}/content", content=data)).raise_for_status()
    commit_started = time.perf_counter()
    (await http.post(f"{base}/objects/{object_id}/commit")).raise_for_status()
    ended = time.perf_counter()
    if phases:
        print(
            f"prepare {put_started - started:.3f}s upload {commit_started - put_started:.3f}s "
            f"commit {ended - commit_started:.3f}s",
            file=sys.stderr,
        )
    return ended - started


def _direct_write(store_url: str, data: bytes) -> float:
    """The same bytes to the same store, without the service: a file written and
    fsynced in the same folder, or one GCS upload to the same bucket."""
    started = time.perf_counter()
    if store_url.startswith("file://"):
        path = Path(store_url[len("file://") :]) / f"direct-{secrets.token_hex(6)}"
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        elapsed = time.perf_counter() - started
        path.unlink()
        return elapsed
    from google.cloud import storage

    bucket = storage.Client().bucket(store_url[len("gs://") :].split("/")[0])
    blob = bucket.blob(f"direct-{secrets.token_hex(6)}")
    blob.upload_from_string(data, content_type="application/octet-stream")
    elapsed = time.perf_counter() - started
    blob.delete()
    return elapsed


async def _run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    emulator = None
    try:
        await migrate(dsn)
        folder = tempfile.mkdtemp(prefix="ds-bench-objects-")
        if args.store == "gcs":
            from gcp_storage_emulator.server import create_server

            port = free_port()
            emulator = create_server("127.0.0.1", port, in_memory=True, default_bucket="bench")
            emulator.start()
            os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
            store_url = "gs://bench"
        else:
            store_url = Path(folder).as_uri()
        secret = "bench-secret-" + secrets.token_hex(16)
        settings = Settings(
            database_url=dsn, jwt_secret=secret, region="local", object_stores={"local": store_url}
        )
        size = args.size_mib * MiB
        data = os.urandom(size)
        digest = hashlib.sha256(data).hexdigest()
        headers = {"Authorization": f"Bearer {_token(secret)}"}
        with ServerProcess(settings) as server:
            assert server.process is not None
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=300, limits=HTTP_LIMITS
            ) as http:
                (
                    await http.post(
                        f"{API}/runs/bench-run/streams",
                        json={"stream_id": "objects", "direction": "output"},
                    )
                ).raise_for_status()
                base = f"{API}/runs/bench-run/streams/objects"
                await _upload_commit(http, base, b"warm", hashlib.sha256(b"warm").hexdigest())
                sampler = PeakRss(server.process.pid)
                rss_before = sampler.current()
                service_times = []
                direct_times = []
                with sampler:
                    for _ in range(args.runs):
                        service_times.append(
                            await _upload_commit(http, base, data, digest, phases=args.phases)
                        )
                        direct_times.append(await asyncio.to_thread(_direct_write, store_url, data))
        mb = size / 1e6
        return {
            "store": args.store,
            "object_bytes": size,
            "runs": args.runs,
            "upload_commit_mb_s_median": round(mb / statistics.median(service_times), 1),
            "upload_commit_mb_s_best": round(mb / min(service_times), 1),
            "direct_write_mb_s_median": round(mb / statistics.median(direct_times), 1),
            "direct_write_mb_s_best": round(mb / min(direct_times), 1),
            "server_rss_before_mib": round(rss_before / MiB, 1),
            "server_rss_peak_mib": round(sampler.peak / MiB, 1),
            "server_rss_growth_mib": round((sampler.peak - rss_before) / MiB, 1),
        }
    finally:
        if emulator is not None:
            emulator.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.objects", description=__doc__)
    parser.add_argument("--store", choices=["local", "gcs"], default="local")
    parser.add_argument("--size-mib", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--phases", action="store_true", help="print each run's phases")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DUCTOR_STREAMS_DATABASE_URL")
        or os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL"),
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        print("bench.objects: give --database-url (a Postgres server)", file=sys.stderr)
        return 2
    if not 1 <= args.size_mib <= 32:
        print(
            "bench.objects: --size-mib must be 1..32 (objects are at most 32 MiB)", file=sys.stderr
        )
        return 2
    name = f"ds_bench_{secrets.token_hex(4)}"
    dsn = create_database(args.database_url, name)
    try:
        result = asyncio.run(_run(args, dsn))
    finally:
        drop_database(args.database_url, name)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
