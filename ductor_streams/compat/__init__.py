"""Every use of another library's non-public parts, in one place: uvicorn's httptools
protocol, Litestar's streaming response and router internals, asyncio's future
protocol, asyncpg's statement cache and pool queue. pyproject.toml bounds those
libraries from above; tests/foundation/test_private_apis.py checks each part still
exists (docs/speed.md says why each is used)."""
