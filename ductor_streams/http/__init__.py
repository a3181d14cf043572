"""The HTTP edge: translates HTTP <-> store calls, SSE, auth and problem details."""

from ductor_streams.http.app import API_MOUNT, create_app

__all__ = ["API_MOUNT", "create_app"]
