"""Configuration from the environment (CONTRACT.md section 2); CLI flags may override."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


class ConfigError(Exception):
    """A missing or invalid setting; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class Settings:
    """Everything a process of ductor-streams needs to know about its deployment."""

    # Kept out of repr(): a DSN may hold a password, and the secret signs every token.
    database_url: str | None = field(default=None, repr=False)
    jwt_secret: str | None = field(default=None, repr=False)
    region: str = "local"
    object_stores: Mapping[str, str] = field(default_factory=dict)
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    tenant: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        stores_raw = env.get("DUCTOR_STREAMS_OBJECT_STORE", "").strip()
        stores: dict[str, str] = {}
        if stores_raw:
            try:
                parsed = json.loads(stores_raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"DUCTOR_STREAMS_OBJECT_STORE is not JSON: {exc.msg}") from None
            if not isinstance(parsed, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
            ):
                raise ConfigError("DUCTOR_STREAMS_OBJECT_STORE must map region names to URLs")
            for region, url in parsed.items():
                if not url.startswith(("gs://", "file://")):
                    raise ConfigError(
                        f"DUCTOR_STREAMS_OBJECT_STORE[{region!r}] must be a gs:// or file:// URL"
                    )
            stores = parsed
        region = env.get("DUCTOR_STREAMS_REGION", "").strip() or "local"
        return cls(
            database_url=env.get("DUCTOR_STREAMS_DATABASE_URL") or None,
            jwt_secret=env.get("DUCTOR_STREAMS_JWT_SECRET") or None,
            region=region,
            object_stores=stores,
            temporal_address=env.get("DUCTOR_STREAMS_TEMPORAL_ADDRESS") or None,
            temporal_namespace=env.get("DUCTOR_STREAMS_TEMPORAL_NAMESPACE") or "default",
            tenant=env.get("DUCTOR_STREAMS_TENANT") or "default",
        )

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigError("DUCTOR_STREAMS_DATABASE_URL is not set")
        return self.database_url

    def require_jwt_secret(self) -> str:
        if not self.jwt_secret:
            raise ConfigError("DUCTOR_STREAMS_JWT_SECRET is not set")
        if len(self.jwt_secret) < 16:
            raise ConfigError("DUCTOR_STREAMS_JWT_SECRET must be at least 16 characters")
        return self.jwt_secret

    def require_temporal(self) -> str:
        if not self.temporal_address:
            raise ConfigError("DUCTOR_STREAMS_TEMPORAL_ADDRESS is not set")
        return self.temporal_address

    @property
    def object_store_regions(self) -> frozenset[str]:
        return frozenset(self.object_stores)
