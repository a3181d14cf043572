"""Temporal activities over the stream store, and their types.

``StreamsActivities`` holds the activities (create, append, close, ack, read); the
``StreamsPlugin`` registers them. ``error_types`` names every ApplicationError type they
raise; ``models`` holds their inputs and results (sandbox-safe dataclasses).
"""

from ductor_streams.activities import error_types, models
from ductor_streams.activities.errors import domain_errors, to_application_error
from ductor_streams.activities.streams import StreamsActivities

__all__ = [
    "StreamsActivities",
    "domain_errors",
    "error_types",
    "models",
    "to_application_error",
]
