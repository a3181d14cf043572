"""Every setting of a ductor-streams process, read from the environment once, at start.

``Settings.from_env()`` is the only place in the package that reads the environment.
Each field is one variable (``DUCTOR_STREAMS_<FIELD>``; docs/configuration.md lists them
all with their defaults and bounds). A bad value raises ``ConfigError`` naming the
variable, and the CLI turns that into one line and exit 2, before anything starts.
CLI flags may override (``with_overrides``).

Tunables of one part (live delivery, the dispatcher, upkeep) are flat fields here, so
that one table documents them; the part's own config object is built from them by a
property (``live``, ``upkeep``) or a method (``dispatcher_overrides``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["ConfigError", "LiveSettings", "Settings", "UpkeepConfig"]

ENV_PREFIX = "DUCTOR_STREAMS_"
# The standard variables of Temporal's clients (temporalio.envconfig) that the settings
# carry on to every client the project makes.
TEMPORAL_ENV_PREFIX = "TEMPORAL_"
# OpenTelemetry's standard variables (foundation/tracing.py; docs/operators.md): carried to the SDK.
OTEL_ENV_PREFIX = "OTEL_"
OTEL_EXPORTERS = ("otlp", "console", "none")
OTEL_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
GOOGLE_CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
# What sits between the pools and Postgres (DUCTOR_STREAMS_DATABASE_POOLER):
# ``session`` (a direct connection, or a pooler that keeps one server session per
# client connection) or ``transaction`` (a pooler that may hand each transaction to
# another server session: no named prepared statements, no session state).
POOLER_MODES = ("session", "transaction")


# Upkeep's defaults (maintenance/sweep.py, maintenance/retention.py use them too).
DEFAULT_ORPHAN_GRACE_SECONDS = 3600.0
DEFAULT_IDEMPOTENCY_WINDOW_SECONDS = 86_400.0


class ConfigError(Exception):
    """A missing or invalid setting; the CLI prints it on one line and exits 2."""


# The config objects of the parts: ``Settings`` builds each from its flat fields
# (``Settings.live``, ``Settings.upkeep``); tests and embedding code make them directly.


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """How live delivery behaves in this process.

    ``keepalive_seconds``: idle time after which an SSE comment is sent (the contract
    asks for one at least every 15 s). ``buffer_records``: records a subscriber may
    hold in memory before it falls back to reading from Postgres. ``page_records``:
    records per backfill / repair / follower read. ``poll_seconds``: a follower also
    reads when no wake came for this long, so a lost notification (e.g. a writer that
    died between its commit and its NOTIFY) delays delivery but never stalls it.
    ``watch_seconds``: how long a follower's watch of its stream lasts (appends notify
    while it does); renewed every third of it while followed. Not from the environment.

    A subscriber's memory is bounded in bytes too: ``buffer_bytes`` of buffered records
    (past it, as past ``buffer_records``, it reads Postgres instead), ``page_bytes`` per
    read (not from the environment), and ``write_chunk`` bytes per write to its socket, so
    a slow reader holds at most about one chunk in the server's send buffer.
    ``stall_seconds``: a write that the client has not accepted for this long ends the
    connection (the client resumes with Last-Event-ID).
    """

    keepalive_seconds: float = 10.0
    buffer_records: int = 4096
    page_records: int = 500
    poll_seconds: float = 5.0
    watch_seconds: float = 60.0
    buffer_bytes: int = 4 * 1024 * 1024
    page_bytes: int = 256 * 1024
    write_chunk: int = 64 * 1024
    stall_seconds: float = 30.0


@dataclass(frozen=True)
class UpkeepConfig:
    """How often upkeep runs, in seconds (``Settings.upkeep`` builds it from
    ``DUCTOR_STREAMS_MAINTENANCE_INTERVAL``, ``_ORPHAN_SWEEP_INTERVAL``,
    ``_ORPHAN_GRACE`` and ``_IDEMPOTENCY_WINDOW_SECONDS``). The orphan sweep runs less
    often because listing a bucket costs more; the grace is longer than any upload in
    flight; append receipts outlive their records by the idempotency window."""

    interval_seconds: float = 30.0
    orphan_interval_seconds: float = 600.0
    orphan_grace_seconds: float = DEFAULT_ORPHAN_GRACE_SECONDS
    idempotency_window_seconds: float = DEFAULT_IDEMPOTENCY_WINDOW_SECONDS


# Fields whose variable is not simply DUCTOR_STREAMS_<FIELD>.
_ENV_NAMES = {
    "object_stores": ENV_PREFIX + "OBJECT_STORE",
    "google_application_credentials": GOOGLE_CREDENTIALS_ENV,
}


# An origin as a browser sends it: scheme://host[:port], no path, no trailing slash.
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9_~.-]+)(:[0-9]{1,5})?")


def _env(field: str) -> str:
    """The environment variable of a settings field."""
    return _ENV_NAMES.get(field) or ENV_PREFIX + field.upper()


# DUCTOR_STREAMS_PUBLIC_URL: http(s)://host[:port], then an optional path prefix without a
# trailing slash (nothing a URL would need escaping).
_PUBLIC_URL = (
    r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_~.-]+)(:[0-9]{1,5})?"
    r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)*$"
)


class Settings(BaseModel):
    """Everything a process of ductor-streams needs to know about its deployment.

    Immutable. Made by ``from_env()`` in the CLI, or directly with keyword arguments
    (tests, embedding code): both validate the same way.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # Kept out of repr(): a DSN may hold a password, and the secret signs every token.
    database_url: str | None = Field(
        default=None, repr=False, pattern=r"^postgres(ql)?://", max_length=4096
    )
    # A direct or session-mode connection for what needs a session of its own (LISTEN,
    # the migration lock) when DATABASE_URL goes through a transaction pooler.
    direct_database_url: str | None = Field(
        default=None, repr=False, pattern=r"^postgres(ql)?://", max_length=4096
    )
    database_pooler: Literal["session", "transaction"] = "session"
    jwt_secret: str | None = Field(default=None, repr=False, min_length=16, max_length=4096)
    region: str = Field(default="local", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    object_stores: dict[str, str] = Field(default_factory=dict)
    tenant: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}$")

    # Temporal: the project's own two variables win over the standard TEMPORAL_* ones
    # (temporal_connection.py merges them).
    temporal_address: str | None = Field(default=None, pattern=r"^\S+:[0-9]{1,5}$")
    temporal_namespace: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$"
    )
    temporal_environ: dict[str, str] = Field(default_factory=dict, repr=False)

    # serve
    host: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9_.:\[\]-]{1,255}$")
    port: int = Field(default=8000, ge=1, le=65535)
    pool_min_size: int = Field(default=2, ge=0, le=1000)
    pool_max_size: int = Field(default=10, ge=1, le=1000)
    shutdown_timeout_seconds: float = Field(default=10.0, ge=0, le=3600)
    head_timeout_seconds: float = Field(default=10.0, ge=0.1, le=600)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # None: the file-descriptor limit less what the process needs for itself.
    max_connections: int | None = Field(default=None, ge=16, le=1_000_000)
    # Live reads (SSE, long-poll) of one tenant at once, per process; None: half the
    # connection cap (http/middleware/live_reads.py says why).
    tenant_max_live: int | None = Field(default=None, ge=1, le=1_000_000)
    log_level: str = "INFO"
    # Origins whose pages may call the API (http/middleware/cors.py); empty: no CORS at all.
    cors_origins: tuple[str, ...] = ()
    # uvicorn's access log (one JSON line per request); off by default: docs/operators.md
    # gives its cost on the append path.
    access_log: bool = False
    # Where clients reach this deployment (scheme://host[:port][/prefix]): absolute URLs
    # the server hands out (a Durable Streams PUT's Location) start with it. Unset: the
    # request's own scheme and (checked) Host.
    public_url: str | None = Field(default=None, pattern=_PUBLIC_URL, max_length=2048)

    # tenant isolation (docs/security.md, "Tenant isolation")
    tenant_max_streams: int = Field(default=100_000, ge=1, le=1_000_000_000)
    # An append receipt (the answer an Idempotency-Key replays) is kept while its
    # records are retained, and at least this long after the append.
    idempotency_window_seconds: float = Field(default=86_400.0, ge=0, le=365 * 86_400)

    # live delivery (LiveSettings)
    sse_keepalive_seconds: float = Field(default=10.0, ge=0.05, le=15)
    sse_buffer_records: int = Field(default=4096, ge=1, le=10_000_000)
    sse_page_records: int = Field(default=500, ge=1, le=1000)
    live_poll_seconds: float = Field(default=5.0, ge=0.05, le=3600)
    sse_buffer_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=1024**3)
    sse_stall_seconds: float = Field(default=30.0, ge=0.5, le=3600)

    # catch-up reads: native pages, DS catch-up, object downloads (docs/security.md,
    # "Tenant isolation")
    read_stall_seconds: float = Field(default=10.0, ge=0.5, le=3600)
    read_piece_bytes: int = Field(default=256 * 1024, ge=16 * 1024, le=16 * 1024 * 1024)
    tenant_max_reads: int = Field(default=8, ge=1, le=100_000)
    tenant_read_wait_seconds: float = Field(default=1.0, ge=0, le=60)

    # the Durable Streams endpoint (docs/durable-streams.md)
    ds_long_poll_seconds: float = Field(default=20.0, ge=0.05, le=300)
    ds_sse_seconds: float = Field(default=60.0, ge=0.05, le=3600)

    # input delivery (DispatcherConfig); None keeps the dispatcher's own default
    delivery_lease_seconds: float | None = Field(default=None, ge=0.5, le=3600)
    delivery_batch: int | None = Field(default=None, ge=1, le=10_000)
    delivery_streams: int | None = Field(default=None, ge=1, le=10_000)
    delivery_owner: str | None = Field(default=None, min_length=1, max_length=200)

    # upkeep (UpkeepConfig)
    maintenance_interval: float = Field(default=30.0, gt=0, le=86_400)
    orphan_sweep_interval: float = Field(default=600.0, ge=0, le=30 * 86_400)
    orphan_grace: float = Field(default=3600.0, ge=0, le=30 * 86_400)

    # large objects
    object_intent_ttl: float = Field(default=3600.0, ge=1, le=7 * 86_400)
    google_application_credentials: str | None = None

    # OpenTelemetry (foundation/tracing.py): every OTEL_* variable, validated where it decides
    # whether and how this process traces.
    otel_environ: dict[str, str] = Field(default_factory=dict, repr=False)

    @field_validator("google_application_credentials")
    @classmethod
    def _credentials_file_exists(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isfile(value):
            raise ValueError(f"{value!r} is not a readable file")
        return value

    @field_validator("object_stores", mode="before")
    @classmethod
    def _parse_object_store(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return {}
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"is not JSON: {exc.msg}") from None
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError("must map region names to URLs")
        for region, url in value.items():
            if not url.startswith(("gs://", "file://")):
                raise ValueError(f"[{region!r}] must be a gs:// or file:// URL")
        return dict(value)

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _parse_cors_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a comma-separated list of origins, or *")
        origins = tuple(dict.fromkeys(v.strip().lower() for v in value if v.strip()))
        if "*" in origins and len(origins) > 1:
            raise ValueError("* allows every origin and cannot be combined with others")
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin (scheme://host[:port], without a path)"
                )
        return origins

    @field_validator("database_pooler", mode="before")
    @classmethod
    def _parse_pooler(cls, value: Any) -> Any:
        text = str(value).strip().lower()
        if text not in POOLER_MODES:
            raise ValueError(f"must be one of {', '.join(POOLER_MODES)}, not {value!r}")
        return text

    @field_validator("log_level", mode="before")
    @classmethod
    def _parse_log_level(cls, value: Any) -> str:
        text = str(value).strip().upper()
        if text.isdigit() or isinstance(logging.getLevelName(text), int):
            return text
        raise ValueError("must be DEBUG, INFO, WARNING, ERROR, CRITICAL or a number")

    @field_validator("otel_environ")
    @classmethod
    def _check_otel(cls, value: dict[str, str]) -> dict[str, str]:
        exporters = [e.strip() for e in value.get("OTEL_TRACES_EXPORTER", "").split(",")]
        for exporter in exporters:
            if exporter and exporter not in OTEL_EXPORTERS:
                raise ValueError(
                    f"OTEL_TRACES_EXPORTER: {exporter!r} is not one of {', '.join(OTEL_EXPORTERS)}"
                )
        sampler = value.get("OTEL_TRACES_SAMPLER", "").strip()
        if sampler and sampler not in OTEL_SAMPLERS:
            raise ValueError(f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of the standard ones")
        ratio = value.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        if ratio and "ratio" in sampler:
            try:
                valid = 0.0 <= float(ratio) <= 1.0
            except ValueError:
                valid = False
            if not valid:
                raise ValueError("OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1")
        for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
            protocol = value.get(name, "").strip()
            if protocol and protocol != "http/protobuf":
                raise ValueError(f"{name}: only http/protobuf is supported, not {protocol!r}")
        return value

    @model_validator(mode="after")
    def _pool_sizes(self) -> Settings:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(f"{_env('pool_min_size')} must not exceed {_env('pool_max_size')}")
        return self

    # -- reading ---------------------------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment gives; ``ConfigError`` names a bad variable.

        An empty variable counts as unset. Unknown ``DUCTOR_STREAMS_*`` variables are
        ignored (the test suite's own, for one).
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            if name in ("temporal_environ", "otel_environ"):
                continue
            raw = env.get(_env(name), "").strip()
            if raw:
                values[name] = raw
        values["temporal_environ"] = {
            k: v for k, v in env.items() if k.startswith(TEMPORAL_ENV_PREFIX)
        }
        values["otel_environ"] = {
            k: v.strip() for k, v in env.items() if k.startswith(OTEL_ENV_PREFIX) and v.strip()
        }
        return cls.validated(**values)

    @classmethod
    def validated(cls, **values: Any) -> Settings:
        """``Settings(**values)``, with a validation error turned into ``ConfigError``."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with the given non-None values (CLI flags) replaced, validated again."""
        changed = {k: v for k, v in changes.items() if v is not None}
        return self.validated(**{**self.model_dump(), **changed})

    # -- requirements of one command ------------------------------------------------

    def require_database(self) -> str:
        if not self.database_url:
            raise ConfigError(f"{_env('database_url')} is not set")
        return self.database_url

    def require_session_database(self) -> str:
        """The DSN of a connection that keeps one server session (LISTEN, the migration
        lock): ``DIRECT_DATABASE_URL`` when set, else ``DATABASE_URL`` unless that goes
        through a transaction pooler, in which case a ``ConfigError`` says what to set."""
        dsn = self.require_database()
        if self.direct_database_url:
            return self.direct_database_url
        if self.database_pooler == "transaction":
            raise ConfigError(
                f"{_env('direct_database_url')} is not set: with "
                f"{_env('database_pooler')}=transaction, LISTEN and the migration lock need "
                "a direct or session-mode connection to Postgres"
            )
        return dsn

    @property
    def transaction_pooled(self) -> bool:
        """Whether ``DATABASE_URL`` goes through a transaction pooler (its connections
        then carry no named prepared statements and no session state)."""
        return self.database_pooler == "transaction"

    def require_jwt_secret(self) -> str:
        if not self.jwt_secret:
            raise ConfigError(f"{_env('jwt_secret')} is not set")
        return self.jwt_secret

    def require_temporal(self) -> str:
        if not self.temporal_address:
            raise ConfigError(f"{_env('temporal_address')} is not set")
        return self.temporal_address

    # -- views for the parts ----------------------------------------------------------

    @property
    def object_store_regions(self) -> frozenset[str]:
        return frozenset(self.object_stores)

    @property
    def log_level_number(self) -> int:
        text = self.log_level
        return int(text) if text.isdigit() else int(logging.getLevelName(text))

    @property
    def trace_exporters(self) -> tuple[str, ...]:
        """The span exporters this process uses: none (tracing off) unless the
        OpenTelemetry variables ask for one. ``OTEL_TRACES_EXPORTER`` names them
        (``otlp``, ``console``, ``none``); unset, an OTLP endpoint alone means ``otlp``.
        ``OTEL_SDK_DISABLED=true`` turns tracing off whatever else is set."""
        env = self.otel_environ
        if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return ()
        named = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
        if named:
            return tuple(dict.fromkeys(e for e in named if e != "none"))
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            return ("otlp",)
        return ()

    @property
    def live(self) -> LiveSettings:
        return LiveSettings(
            keepalive_seconds=self.sse_keepalive_seconds,
            buffer_records=self.sse_buffer_records,
            page_records=self.sse_page_records,
            poll_seconds=self.live_poll_seconds,
            buffer_bytes=self.sse_buffer_bytes,
            stall_seconds=self.sse_stall_seconds,
        )

    @property
    def upkeep(self) -> UpkeepConfig:
        return UpkeepConfig(
            interval_seconds=self.maintenance_interval,
            orphan_interval_seconds=self.orphan_sweep_interval,
            orphan_grace_seconds=self.orphan_grace,
            idempotency_window_seconds=self.idempotency_window_seconds,
        )

    def dispatcher_overrides(self) -> dict[str, Any]:
        """``DispatcherConfig`` fields the environment sets (the rest keep its defaults)."""
        given = {
            "lease_seconds": self.delivery_lease_seconds,
            "per_stream": self.delivery_batch,
            "max_streams": self.delivery_streams,
        }
        return {k: v for k, v in given.items() if v is not None}


def _one_line(exc: ValidationError) -> str:
    """The first error of ``exc`` as ``VARIABLE: what is wrong``."""
    error = exc.errors()[0]
    loc = error.get("loc") or ()
    message = str(error.get("msg", "is invalid")).removeprefix("Value error, ")
    if not loc:
        return message
    field = str(loc[0])
    if field not in Settings.model_fields:
        return f"unknown setting {field!r}"
    if field == "otel_environ":  # the message names the OTEL_* variable
        return message
    return f"{_env(field)}: {message}"
