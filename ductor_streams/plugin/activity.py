"""The activity helpers under the name they were first published with.

``ductor_streams.plugin.streaming`` is their home (docs/temporal.md, "Streaming from
activities"); this module keeps ``from ductor_streams.plugin.activity import
stream_writer`` working for code written before the rename.
"""

from ductor_streams.plugin.streaming import (
    HEARTBEAT_KEY,
    RETRY_MARKER_TYPE,
    AttemptOutput,
    RetryInfo,
    RetryPolicy,
    StreamReader,
    StreamWriter,
    heartbeat,
    previous_heartbeat,
    retry_marker,
    stream_reader,
    stream_writer,
)

__all__ = [
    "HEARTBEAT_KEY",
    "RETRY_MARKER_TYPE",
    "AttemptOutput",
    "RetryInfo",
    "RetryPolicy",
    "StreamReader",
    "StreamWriter",
    "heartbeat",
    "previous_heartbeat",
    "retry_marker",
    "stream_reader",
    "stream_writer",
]
