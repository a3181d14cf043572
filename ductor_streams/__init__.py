"""ductor-streams: durable data streams for Temporal workflow runs, kept in Postgres.

Core: ``store`` (definitions, append, read, ack), ``live`` (LISTEN hub, followers),
``objects``, ``delivery``, ``maintenance``. Edges: ``http``, ``activities``, ``plugin``,
``client`` and the ``ductor-streams`` command (``cli``).
"""

__version__ = "0.1.0"
