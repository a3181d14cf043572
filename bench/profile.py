"""Profile the server under an append load: where does its CPU go per request?

    python -m bench.profile [--shape 16x1] [--seconds 5] [--top 40]

Starts the same isolated database and ``serve --no-workers`` subprocess as
``bench.append``, drives one of its shapes with ``bench.loadgen`` and attaches py-spy
(``pip install -e '.[profile]'``) to the server process meanwhile. Prints the functions
with the most samples, self and cumulative. Not part of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.append import API, PAYLOAD, SHAPES, _create_streams
from bench.environment import bench_token, isolated_database, postgres_server, service
from ductor_streams.schema.migrate import migrate


def _frame(raw: str) -> str:
    name, _, where = raw.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}"


def summarise(raw_path: Path, top: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            cumulative[frame] += n
    print(f"{total} samples")
    for title, counter in (("self", own), ("cumulative", cumulative)):
        print(f"--- {title}")
        for frame, n in counter.most_common(top):
            print(f"{100 * n / max(1, total):5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--shape", default="16x1", choices=[s.key for s in SHAPES])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None:
        print(
            "bench.profile: py-spy is not installed (pip install -e '.[profile]')", file=sys.stderr
        )
        return 2
    shape = next(s for s in SHAPES if s.key == args.shape)
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        with service(dsn) as (server, settings), tempfile.TemporaryDirectory() as tmp:
            assert settings.jwt_secret is not None and server.process is not None
            token = bench_token(settings.jwt_secret)
            headers = {"Authorization": f"Bearer {token}"}
            run_id = f"profile-{uuid.uuid4().hex[:8]}"
            streams = _create_streams(server.url, headers, run_id, shape)
            spec = {
                "seconds": args.seconds + 2,
                "warmup": 0.5,
                "connections": [
                    {
                        "path": f"{API}/runs/{run_id}/streams/{streams[i % shape.streams]}/records",
                        "body": {"records": [{"payload": PAYLOAD}] * shape.batch},
                        "headers": headers,
                    }
                    for i in range(shape.connections)
                ],
            }
            spec_path = Path(tmp) / "spec.json"
            spec_path.write_text(json.dumps(spec))
            raw = Path(tmp) / "profile.txt"
            load = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.loadgen",
                    "--port",
                    str(server.port),
                    "--spec",
                    str(spec_path),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.0)
            subprocess.run(
                [
                    "py-spy",
                    "record",
                    "-p",
                    str(server.process.pid),
                    "-d",
                    str(int(args.seconds)),
                    "-r",
                    "500",
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                ],
                check=True,
                capture_output=True,
            )
            out, _ = load.communicate()
            print(f"load: {out.strip()}")
            summarise(raw, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
