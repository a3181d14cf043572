"""The ``ductor-streams`` command.

Exit codes: 0 ok, 2 bad usage or configuration (one line on stderr), 1 other failure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import ConfigError, Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor-streams", description="Durable data streams for Temporal workflow runs."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = sub.add_parser("migrate", help="apply pending migrations (safe to run concurrently)")
    migrate.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="retry while Postgres cannot be reached, up to this long (default 0)",
    )

    serve = sub.add_parser("serve", help="run the HTTP app (and workers unless --no-workers)")
    serve.add_argument("--host", help="address to listen on (default DUCTOR_STREAMS_HOST)")
    serve.add_argument("--port", type=int, help="port (default DUCTOR_STREAMS_PORT)")
    serve.add_argument("--no-workers", action="store_true", help="HTTP only; needs no Temporal")

    sub.add_parser("workers", help="run the dispatcher and maintenance workers only")
    sub.add_parser("prune", help="run one retention/orphan/deletion pass, then exit")

    token = sub.add_parser("token", help="print a signed bearer token")
    token.add_argument("--sub", required=True)
    token.add_argument("--tenant", required=True)
    token.add_argument("--scope", action="append", required=True, choices=SCOPES)
    token.add_argument("--run", action="append", required=True)
    token.add_argument("--region")
    token.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")

    outbox = sub.add_parser("outbox", help="operator view of input delivery")
    outbox.add_argument(
        "action", nargs="?", default="list", choices=["list", "show", "retry", "summary", "gaps"]
    )
    outbox.add_argument("delivery_id", nargs="?", type=int)
    outbox.add_argument("--state", help="pending, retrying, delivered or dead")
    outbox.add_argument("--run", help="run ID")
    outbox.add_argument("--stream", help="stream ID")
    outbox.add_argument("--tenant", help="one tenant only (default: every tenant)")
    outbox.add_argument("--older-than", metavar="SECONDS", help="created at least this long ago")
    outbox.add_argument("--limit", help="rows per page, 1-1000 (default 100)")
    outbox.add_argument("--page", help="the page token a previous list printed")
    outbox.add_argument("--by", help="who retries (default cli:<user>@<host>), for the audit")
    outbox.add_argument("--json", action="store_true", help="print JSON, as the HTTP API does")

    doctor = sub.add_parser(
        "doctor", help="check this deployment against the guarantees (exit 1 on a failure)"
    )
    doctor.add_argument("--json", action="store_true", help="print JSON, one object per check")
    doctor.add_argument("--strict", action="store_true", help="exit 1 on a warning too")
    doctor.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long each check may take, 1-300 (default 10)",
    )

    dev = sub.add_parser("dev", help="zero-config local stack: Postgres, Temporal, app, workers")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--data-dir", default=".dev")
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("ductor-streams")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        return _run(args, settings)
    except ConfigError as exc:
        print(f"ductor-streams: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Each command imports its module when it runs, not at the top: `token` and
    # `migrate` start without loading the server, the Temporal SDK or the plugin.
    if args.command == "token":
        if args.ttl <= 0:
            raise ConfigError("--ttl must be a positive number of seconds")
        print(
            issue_token(
                settings.require_jwt_secret(),
                sub=args.sub,
                tenant=args.tenant,
                scopes=args.scope,
                runs=args.run,
                region=args.region,
                ttl_seconds=args.ttl,
            )
        )
        return 0
    if args.command == "migrate":
        from ductor_streams.process.migrate_wait import migrate_when_reachable
        from ductor_streams.schema.legacy import LegacyChainIncomplete

        if not 0 <= args.wait <= 3600:
            raise ConfigError("--wait must be between 0 and 3600 seconds")
        # The direct connection when there is one (the lock then is a session lock);
        # else through the pooler, each migration under a transaction lock if need be.
        dsn = settings.require_database()
        dsn = settings.direct_database_url or dsn
        pooled = settings.transaction_pooled and not settings.direct_database_url
        try:
            applied = asyncio.run(migrate_when_reachable(dsn, args.wait, pooled=pooled))
        except LegacyChainIncomplete as exc:
            print(f"ductor-streams migrate: {exc}", file=sys.stderr)
            return 1
        for migration in applied:
            if migration.adopted:
                print(
                    f"recorded {migration.version:04d}_{migration.name}: the database ran "
                    "the whole pre-baseline chain, which made the same schema"
                )
            else:
                print(f"applied {migration.version:04d}_{migration.name}")
        if not applied:
            print("migrations are current")
        return 0
    if args.command == "serve":
        from ductor_streams.process.serve import serve

        settings = settings.with_overrides(host=args.host, port=args.port)
        return serve(settings, workers=not args.no_workers)
    if args.command == "workers":
        from ductor_streams.process.workers import run_workers

        return run_workers(settings)
    if args.command == "prune":
        from ductor_streams.maintenance.command import prune_once

        return prune_once(settings)
    if args.command == "dev":
        from ductor_streams.process.dev import run_dev

        return run_dev(settings, port=args.port, data_dir=args.data_dir)
    if args.command == "doctor":
        from ductor_streams.process.doctor import run_doctor

        if not 1 <= args.timeout <= 300:
            raise ConfigError("--timeout must be between 1 and 300 seconds")
        code = run_doctor(settings, json=args.json, strict=args.strict, timeout=args.timeout)
        # The report is written: end here, without the interpreter's finalisation. The
        # checks leave native threads behind (the Temporal client's runtime, the storage
        # client's), and finalising around them under load has ended the process with
        # SIGABRT after a complete report, turning its exit status into a crash.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.command == "outbox":
        from ductor_streams.ops.cli_outbox import run_outbox

        return run_outbox(settings, args)
    raise ConfigError(f"`{args.command}` is not available in this build yet")


if __name__ == "__main__":
    sys.exit(main())
