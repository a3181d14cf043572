"""google-cloud-storage's ``BlobWriter`` has no abort: its buffer is closed here."""

from __future__ import annotations

from typing import Any


def abandon_upload(writer: Any) -> None:
    """End a resumable upload without making an object of it.

    Closing a ``BlobWriter`` (also when it is garbage collected) finishes the upload.
    Closing its buffer (``_buffer``, not public) first makes ``close()`` upload nothing,
    so an abandoned resumable session never becomes an object."""
    writer._buffer.close()
    writer.close()
