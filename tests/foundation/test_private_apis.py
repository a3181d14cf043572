"""The parts of uvicorn, Litestar, asyncio, asyncpg and google-cloud-storage this code
leans on that are not their public API (docs/speed.md lists why each is used). All but
google-cloud-storage's are used in ductor_streams/compat/ alone, one module a library
(test_private_parts_are_used_in_compat_only checks that). pyproject.toml bounds those
packages from above; when a new release moves one of these, this test says which one
and where it is used, instead of a server that fails at its first request."""

from __future__ import annotations

import asyncio
import inspect

import pytest


def _has(owner: object, *names: str) -> list[str]:
    return [name for name in names if not hasattr(owner, name)]


def test_uvicorn_httptools_protocol() -> None:
    # compat/uvicorn_protocol.py subclasses it and overrides these; it reads
    # self.transport, self.loop, self.scope, and self.url and self.headers (the request
    # head's target and headers, at on_headers_complete).
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    missing = _has(
        HttpToolsProtocol,
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    )
    assert not missing, (
        f"uvicorn's HttpToolsProtocol lost {missing}: compat/uvicorn_protocol.py "
        "overrides them (docs/security.md, 'Connections')"
    )
    source = inspect.getsource(HttpToolsProtocol)
    for attribute in ("self.transport", "self.loop", "self.scope", "self.url", "self.headers"):
        assert attribute in source, (
            f"uvicorn's HttpToolsProtocol no longer sets {attribute}, which "
            "compat/uvicorn_protocol.py uses"
        )


def test_uvicorn_response_cycle_for_chunk_writes() -> None:
    # compat/uvicorn_protocol.py's ChunkWriter writes SSE body chunks to the transport as
    # RequestResponseCycle.send would (docs/speed.md, "Direct SSE writes"): it reads the
    # protocol's cycle and flow, the cycle's state, and frames chunks as send does.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    protocol = inspect.getsource(HttpToolsProtocol)
    for attribute in ("self.cycle", "self.flow"):
        assert attribute in protocol, (
            f"uvicorn's HttpToolsProtocol no longer sets {attribute}, which "
            "compat/uvicorn_protocol.py's ChunkWriter uses"
        )
    source = inspect.getsource(RequestResponseCycle)
    for attribute in (
        "self.scope",
        "self.response_started",
        "self.response_complete",
        "self.chunked_encoding",
        "self.disconnected",
        "self.flow.write_paused",
    ):
        assert attribute in source, (
            f"uvicorn's RequestResponseCycle no longer has {attribute}, which "
            "compat/uvicorn_protocol.py's ChunkWriter reads"
        )
    assert 'b"%x\\r\\n" % len(body), body, b"\\r\\n"' in source, (
        "uvicorn's send frames body chunks differently now: compat/uvicorn_protocol.py's "
        "chunk_frame must write what it writes"
    )


def test_uvicorn_server_shutdown() -> None:
    # compat/uvicorn_server.py's DrainingServer overrides shutdown(sockets) and closes
    # self.servers.
    import uvicorn

    parameters = inspect.signature(uvicorn.Server.shutdown).parameters
    assert "sockets" in parameters, "uvicorn.Server.shutdown lost its sockets parameter"
    assert "self.servers" in inspect.getsource(uvicorn.Server), (
        "uvicorn.Server no longer keeps its listeners in self.servers "
        "(compat/uvicorn_server.py closes them first)"
    )


def test_litestar_streaming_response_and_schema_router() -> None:
    # compat/litestar.py: BodyHookedStreamingResponse overrides ASGIStreamingResponse._stream
    # (the SSE response's base); is_schema_not_found_handler knows the handler Litestar
    # registers for unknown schema paths by its name; allowed_methods reads the Allow
    # header from the 405 exception Litestar's router raises.
    from litestar.response.streaming import ASGIStreamingResponse

    assert _has(ASGIStreamingResponse, "_stream", "send_body") == [], (
        "Litestar's ASGIStreamingResponse lost _stream or send_body: compat/litestar.py "
        "overrides _stream "
        "(docs/speed.md, 'Direct SSE writes')"
    )
    import litestar._openapi.plugin as openapi_plugin

    assert "handle_schema_path_not_found" in inspect.getsource(openapi_plugin), (
        "Litestar no longer names its unknown-schema-path handler "
        "handle_schema_path_not_found: compat/litestar.py knows it by that name"
    )
    import litestar._asgi.routing_trie.traversal as traversal

    assert '"allow"' in inspect.getsource(traversal), (
        "Litestar's router no longer puts the allowed methods in the 405 exception's "
        "'allow' header: compat/litestar.py reads it for the Allow header"
    )


def test_asyncio_future_blocking_protocol() -> None:
    # compat/asyncio_tasks.py (finish_started) drives a coroutine stepped by hand and
    # clears the mark a yielded future carries, as asyncio.Task does.
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        assert hasattr(future, "_asyncio_future_blocking"), (
            "asyncio futures lost _asyncio_future_blocking: compat/asyncio_tasks.py relies "
            "on it (docs/speed.md, 'Eager statement start')"
        )
        future.cancel()
    finally:
        loop.close()


def test_google_cloud_storage_calls() -> None:
    # objects/gcs.py: resumable uploads through Blob.open("wb"), reads through
    # Blob.open("rb"), server-side copies, listings and V4 signed URLs.
    storage = pytest.importorskip("google.cloud.storage")
    missing = _has(storage.Blob, "open", "generate_signed_url", "delete", "reload")
    missing += _has(storage.Bucket, "blob", "copy_blob")
    missing += _has(storage.Client, "list_blobs", "bucket")
    assert not missing, f"google-cloud-storage lost {missing}, which objects/gcs.py calls"
    parameters = inspect.signature(storage.Blob.open).parameters
    assert "chunk_size" in parameters, "Blob.open lost chunk_size (objects/gcs.py sets it)"


def test_asyncpg_statement_preparation_for_transaction_poolers() -> None:
    # compat/asyncpg_statements.py overrides Connection._get_statement and
    # _drop_local_statement_cache and keeps statement states that asyncpg marked
    # unprepared (docs/speed.md, "Described unnamed statements"; docs/deploy.md,
    # "Transaction pooler").
    import asyncpg
    from asyncpg.protocol.protocol import PreparedStatementState

    parameters = list(inspect.signature(asyncpg.Connection._get_statement).parameters)
    assert parameters == [
        "self",
        "query",
        "timeout",
        "named",
        "use_cache",
        "ignore_custom_codec",
        "record_class",
    ], (
        f"asyncpg's Connection._get_statement changed: {parameters}; "
        "compat/asyncpg_statements.py overrides it"
    )
    assert not _has(asyncpg.Connection, "_drop_local_statement_cache"), (
        "asyncpg's Connection lost _drop_local_statement_cache, which "
        "compat/asyncpg_statements.py overrides"
    )
    assert not _has(PreparedStatementState, "name", "prepared", "mark_unprepared")
    source = inspect.getsource(asyncpg.Connection._get_statement)
    assert "mark_unprepared()" in source and "_stmt_cache_enabled" in source, (
        "asyncpg no longer marks an unnamed statement unprepared when its cache is off: "
        "compat/asyncpg_statements.py relies on each execution sending its Parse again"
    )


def test_google_cloud_storage_blob_writer_buffer() -> None:
    # compat/gcs.py closes a BlobWriter's buffer to abandon its upload.
    fileio = pytest.importorskip("google.cloud.storage.fileio")
    assert "self._buffer" in inspect.getsource(fileio.BlobWriter), (
        "google-cloud-storage's BlobWriter no longer keeps self._buffer, which "
        "compat/gcs.py closes to abandon an upload"
    )


def test_asyncpg_pool_queue_of_waiting_acquires() -> None:
    # compat/asyncpg_pool.py counts the waiting acquires as the getters of the pool's
    # queue of free connections.
    import asyncpg

    source = inspect.getsource(asyncpg.pool.Pool)
    assert "self._queue" in source, (
        "asyncpg's Pool no longer keeps its free connections in self._queue: "
        "compat/asyncpg_pool.py reads its waiting getters"
    )
    assert hasattr(asyncio.Queue(), "_getters"), (
        "asyncio.Queue lost _getters, which compat/asyncpg_pool.py counts"
    )


# What gives away another library's private part: its private modules, names that only
# its internals use, or a subclass of a class whose internals are overridden. Test files
# and compat/ itself aside, no module may hold them.
_PRIVATE_MARKS = (
    r"_asyncio_future_blocking",
    r"httptools_impl",
    r"litestar\._",
    r"_get_statement\b",
    r"_drop_local_statement_cache",
    r"handle_schema_path_not_found",
    r"(?<!self)\._queue\b",
    r"\._getters\b",
    r"\(ASGIStreamingResponse\)",
    r"\(uvicorn\.Server\)",
    r"\(HttpToolsProtocol\)",
    r"\._buffer\.close\(",
)


def test_private_parts_are_used_in_compat_only() -> None:
    import re
    from pathlib import Path

    import ductor_streams

    root = Path(ductor_streams.__file__).parent
    found = [
        f"{path.relative_to(root)}: {mark}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "compat"
        for mark in _PRIVATE_MARKS
        if re.search(mark, path.read_text())
    ]
    assert found == [], f"private parts used outside ductor_streams/compat/: {found}"
