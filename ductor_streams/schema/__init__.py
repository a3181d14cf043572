"""The Postgres schema: numbered migrations, the named queries, and the migration runner."""

from ductor_streams.schema.migrate import applied_versions, available_migrations, migrate
from ductor_streams.schema.queries import QUERIES

__all__ = ["QUERIES", "applied_versions", "available_migrations", "migrate"]
