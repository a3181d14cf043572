"""Names that the outside world sees, defined once.

A module with no imports, so that everything can use it: the HTTP app, the Python
client, the dispatcher and the workflow helpers inside Temporal's sandbox alike.
"""

# Where the HTTP API is mounted (health, metrics and the OpenAPI document are at the root).
API_MOUNT = "/api/workflow-streams"

# The Temporal signal that carries input records to a workflow (docs/temporal.md).
INPUT_SIGNAL = "ductor_streams.input"
