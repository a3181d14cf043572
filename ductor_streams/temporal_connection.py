"""How every Temporal client of the project connects: one place that turns the settings
into ``Client.connect`` keyword arguments.

The standard client configuration of Temporal (``temporalio.envconfig``) comes first: a
TOML profile (``TEMPORAL_CONFIG_FILE``, ``TEMPORAL_PROFILE``), then the ``TEMPORAL_*``
variables over it (address, namespace, API key, TLS, gRPC metadata). The project's own
``DUCTOR_STREAMS_TEMPORAL_ADDRESS`` and ``_NAMESPACE`` win over both. docs/temporal.md
describes the setups (TLS cluster, Temporal Cloud).

Only ``ductor_streams.config`` reads the environment: envconfig gets the settings' copy
of the ``TEMPORAL_*`` variables, and the file only when ``TEMPORAL_CONFIG_FILE`` names it
(envconfig's default location is found through ``HOME``, which the settings do not carry).

Everything that can be wrong (a missing file, a profile that is not there, a certificate
that is not PEM, a setting the Python SDK cannot honour) raises ``ConfigError`` with one
line naming the variable, so ``validate`` at start makes the CLI exit 2.
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.envconfig import ClientConfigProfile

from ductor_streams.config import ConfigError, Settings

__all__ = ["configured_address", "connect", "connect_config", "connector", "validate"]

DEFAULT_NAMESPACE = "default"

CONFIG_FILE_ENV = "TEMPORAL_CONFIG_FILE"
PROFILE_ENV = "TEMPORAL_PROFILE"
DEFAULT_PROFILE = "default"
GRPC_META_PREFIX = "TEMPORAL_GRPC_META_"

# envconfig reads these booleans as true/false/1/0 and silently ignores anything else;
# a typo there must not quietly change how the process connects.
_BOOLEAN_ENV = ("TEMPORAL_TLS", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION")

# (variable naming a path, key of the same file in a profile's [tls] table)
_TLS_FILES = (
    ("TEMPORAL_TLS_SERVER_CA_CERT_PATH", "server_ca_cert_path", "server_root_ca_cert"),
    ("TEMPORAL_TLS_CLIENT_CERT_PATH", "client_cert_path", "client_cert"),
    ("TEMPORAL_TLS_CLIENT_KEY_PATH", "client_key_path", "client_private_key"),
)


def connect_config(settings: Settings) -> dict[str, Any]:
    """The ``Client.connect`` keyword arguments for ``settings`` (``target_host``,
    ``namespace``, and ``api_key``, ``tls``, ``rpc_metadata`` when configured).

    Reads the TLS files now. ``ConfigError`` when no Temporal address is configured.
    """
    config = _merged(settings)
    if "target_host" not in config:
        raise ConfigError(
            "no Temporal address: set DUCTOR_STREAMS_TEMPORAL_ADDRESS or TEMPORAL_ADDRESS"
            " (or an address in the TEMPORAL_CONFIG_FILE profile)"
        )
    return config


def configured_address(settings: Settings) -> str | None:
    """The Temporal address the settings name, or None when they name none.

    Validates the rest of the Temporal configuration on the way (``ConfigError``).
    """
    address = _merged(settings).get("target_host")
    return str(address) if address else None


def validate(settings: Settings) -> None:
    """Check the Temporal configuration at start: ``ConfigError`` (one line, naming the
    variable) for a bad file, profile or value. An unset address is not an error here."""
    _merged(settings)


async def connect(settings: Settings, **extra: Any) -> Client:
    """``Client.connect`` with ``connect_config(settings)``; ``extra`` (plugins, a data
    converter, ...) is passed on and wins over the configuration."""
    return await Client.connect(**{**connect_config(settings), **extra})


def connector(settings: Settings, **extra: Any) -> Callable[[], Awaitable[Client]]:
    """A factory that connects on each call, with the configuration resolved (and its
    files read) now: a process that started with valid settings cannot fail later on a
    certificate file removed or rotated under it."""
    config = {**connect_config(settings), **extra}

    async def connect_now() -> Client:
        return await Client.connect(**config)

    return connect_now


def _merged(settings: Settings) -> dict[str, Any]:
    """envconfig's profile (file, then TEMPORAL_* variables) with the project's own two
    variables over it."""
    # An empty variable counts as unset, as the project's own do (envconfig would take
    # an empty TEMPORAL_API_KEY as a key, and turn TLS on for it). An empty
    # TEMPORAL_GRPC_META_* keeps its meaning: it removes that header of the profile.
    environ = {
        name: value
        for name, value in settings.temporal_environ.items()
        if value.strip() or name.startswith(GRPC_META_PREFIX)
    }
    config = _envconfig(environ)
    if settings.temporal_address:
        config["target_host"] = settings.temporal_address
    if settings.temporal_namespace:
        config["namespace"] = settings.temporal_namespace
    config.setdefault("namespace", DEFAULT_NAMESPACE)
    return config


def _envconfig(environ: Mapping[str, str]) -> dict[str, Any]:
    """``temporalio.envconfig``'s connect config from ``environ`` alone."""
    for name in _BOOLEAN_ENV:
        value = environ.get(name)
        if value is not None and value.strip().lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{name}: must be true or false, not {value!r}")
    config_file = environ.get(CONFIG_FILE_ENV) or None
    profile_name = environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if config_file is None and environ.get(PROFILE_ENV):
        raise ConfigError(f"{PROFILE_ENV}: set {CONFIG_FILE_ENV} to the file that holds it")
    if config_file is not None and not Path(config_file).is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}: {config_file} is not a readable file")
    try:
        # disable_file unless a file is named: envconfig would otherwise look in the
        # default location (found through HOME, outside the settings). Strict: a
        # misspelt key (e.g. `server_ca_cert` for `server_ca_cert_path`) would otherwise
        # be dropped without a word and the connection fail later for a reason hard to see.
        profile = ClientConfigProfile.load(
            config_source=Path(config_file) if config_file else None,
            disable_file=config_file is None,
            config_file_strict=True,
            override_env_vars=dict(environ),
        )
    except RuntimeError as exc:  # temporalio's bridge ConfigError is a RuntimeError
        raise ConfigError(_loading_error(str(exc), config_file)) from None
    _check_host_verification(environ, config_file, profile_name)
    if profile.tls is not None:
        for env_name, toml_key, attribute in _TLS_FILES:
            source = getattr(profile.tls, attribute)
            if isinstance(source, Path):
                where = (
                    env_name
                    if environ.get(env_name)
                    else f"{CONFIG_FILE_ENV} [profile.{profile_name}.tls] {toml_key}"
                )
                _check_pem(source, where)
    try:
        return dict(profile.to_client_connect_config())
    except OSError as exc:  # a file that vanished between the check and the read
        raise ConfigError(f"Temporal TLS file: {exc}") from None


def _loading_error(message: str, config_file: str | None) -> str:
    """envconfig's error on one line, led by the variable it is about."""
    message = " ".join(message.split())
    if "TEMPORAL_" in message:  # e.g. both ..._CERT_PATH and ..._CERT_DATA given
        return message
    if message.startswith("Profile "):
        return f"{PROFILE_ENV}: {message}"
    if config_file is not None:
        return f"{CONFIG_FILE_ENV}: {config_file}: {message}"
    return f"Temporal client configuration: {message}"


def _check_host_verification(
    environ: Mapping[str, str], config_file: str | None, profile_name: str
) -> None:
    """The Python SDK has no way to skip host verification, and its envconfig drops the
    setting without a word: refuse it rather than let a deployment think it is off."""
    requested = environ.get("TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", "").strip().lower()
    name = "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"
    if not requested and config_file is not None:
        with open(config_file, "rb") as file:
            tls = tomllib.load(file).get("profile", {}).get(profile_name, {}).get("tls", {})
        requested = str(tls.get("disable_host_verification", "")).lower()
        name = f"{CONFIG_FILE_ENV} [profile.{profile_name}.tls] disable_host_verification"
    if requested in ("true", "1"):
        raise ConfigError(
            f"{name}: not supported by the Temporal Python SDK; give the server's CA"
            " (TEMPORAL_TLS_SERVER_CA_CERT_PATH) and, if the certificate names another"
            " host, TEMPORAL_TLS_SERVER_NAME"
        )


def _check_pem(path: Path, where: str) -> None:
    """A TLS file must be readable PEM; the connection would otherwise fail on first use
    with an error that names no file."""
    try:
        head = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in head:
        raise ConfigError(f"{where}: {path} is not a PEM file")
