"""The Durable Streams protocol over the store: ``{mount}/runs/{run}/ds/v1/stream/{stream}``.

docs/durable-streams.md is the reference (what maps, what does not, how we differ).
``front`` routes a request; ``protocol`` holds the request, the reply and the one error
mapping; ``writes`` answers PUT and POST,
``reads`` GET and HEAD (catch-up and long-poll), ``sse`` the SSE live mode; ``offsets``
and ``media`` are the protocol's offsets and bodies.
"""
