"""The ``ductor-streams`` command.

Exit codes: 0 ok, 2 bad usage or configuration (one line on stderr), 1 other failure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import ConfigError, Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor-streams", description="Durable data streams for Temporal workflow runs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("migrate", help="apply pending migrations (safe to run concurrently)")

    serve = sub.add_parser("serve", help="run the HTTP app (and workers unless --no-workers)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
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
    outbox.add_argument("action", nargs="?", default="list", choices=["list", "show", "retry"])
    outbox.add_argument("delivery_id", nargs="?", type=int)

    dev = sub.add_parser("dev", help="zero-config local stack: Postgres, Temporal, app, workers")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--data-dir", default=".dev")
    return parser


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
        from ductor_streams.schema.migrate import migrate

        applied = asyncio.run(migrate(settings.require_database()))
        for migration in applied:
            print(f"applied {migration.version:04d}_{migration.name}")
        if not applied:
            print("migrations are current")
        return 0
    if args.command == "serve":
        from ductor_streams.serve import serve

        return serve(settings, host=args.host, port=args.port, workers=not args.no_workers)
    if args.command == "dev":
        from ductor_streams.dev import run_dev

        return run_dev(settings, port=args.port, data_dir=args.data_dir)
    raise ConfigError(f"`{args.command}` is not available in this build yet")


if __name__ == "__main__":
    sys.exit(main())
