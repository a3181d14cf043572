"""``make schema``: migrate a fresh database and write ``ductor_streams/schema/schema.sql``.

The database comes from ``DUCTOR_STREAMS_TEST_DATABASE_URL`` (a throwaway database is
created on that server and dropped afterwards) or, without it, from an embedded Postgres,
exactly as for the test suite (tests/support/postgres.py).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from ductor_streams.schema.migrate import migrate
from tests.support.postgres import start_test_database
from tests.support.schema_dump import SCHEMA_FILE, dump_database


async def _migrated_schema(dsn: str) -> str:
    await migrate(dsn)
    return await dump_database(dsn)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ductor-schema-") as workdir:
        db = start_test_database(Path(workdir))
        try:
            text = asyncio.run(_migrated_schema(db.dsn))
        finally:
            db.stop()
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")


if __name__ == "__main__":
    main()
