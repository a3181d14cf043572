"""Raw ASGI fronts that answer the hottest paths before Litestar (records appends
and reads, the Durable Streams protocol)."""
