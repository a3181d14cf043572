"""The parts of uvicorn, Litestar, asyncio and google-cloud-storage this code leans on
that are not their public API (docs/speed.md lists why each is used). pyproject.toml
bounds those packages from above; when a new release moves one of these, this test says
which one and where it is used, instead of a server that fails at its first request."""

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
    # process/serve.py's DrainingServer overrides shutdown(sockets) and closes self.servers.
    import uvicorn

    parameters = inspect.signature(uvicorn.Server.shutdown).parameters
    assert "sockets" in parameters, "uvicorn.Server.shutdown lost its sockets parameter"
    assert "self.servers" in inspect.getsource(uvicorn.Server), (
        "uvicorn.Server no longer keeps its listeners in self.servers "
        "(process/serve.py closes them first)"
    )


def test_litestar_streaming_response_and_schema_router() -> None:
    # http/codecs/sse_response.py subclasses ASGIStreamingResponse; http/routes/openapi.py replaces
    # the handler Litestar registers for unknown schema paths, by its name; http/codecs/problems.py
    # reads the Allow header from the 405 exception Litestar's router raises.
    from litestar.response.streaming import ASGIStreamingResponse

    assert _has(ASGIStreamingResponse, "_stream", "send_body") == [], (
        "Litestar's ASGIStreamingResponse lost _stream or send_body: http/codecs/sse_response.py "
        "overrides _stream "
        "(docs/speed.md, 'Direct SSE writes')"
    )
    import litestar._openapi.plugin as openapi_plugin

    assert "handle_schema_path_not_found" in inspect.getsource(openapi_plugin), (
        "Litestar no longer names its unknown-schema-path handler "
        "handle_schema_path_not_found: http/routes/openapi.py SchemaRouter replaces it by that name"
    )
    import litestar._asgi.routing_trie.traversal as traversal

    assert '"allow"' in inspect.getsource(traversal), (
        "Litestar's router no longer puts the allowed methods in the 405 exception's "
        "'allow' header: http/codecs/problems.py copies it into the Allow header"
    )


def test_asyncio_future_blocking_protocol() -> None:
    # compat/asyncio_tasks.py and http/codecs/sse_response.py drive a coroutine by hand and
    # clear the mark a yielded future carries, as asyncio.Task does.
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        assert hasattr(future, "_asyncio_future_blocking"), (
            "asyncio futures lost _asyncio_future_blocking: compat/asyncio_tasks.py and "
            "http/codecs/sse_response.py rely on it (docs/speed.md, 'Eager statement start')"
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
