"""Bodies in and out: JSON bodies, append bodies (and their worker processes),
SSE responses, problem details, ETags, headers and query parameters."""
