"""The Litestar route handlers of the API, one module a resource, and health,
metrics and the OpenAPI document."""
