"""Names that the outside world sees, defined once.

A module with no imports, so that everything can use it: the HTTP app, the Python
client and the workflow helpers inside Temporal's sandbox alike.
"""

# Where the HTTP API is mounted (health, metrics and the OpenAPI document are at the root).
API_MOUNT = "/api/workflow-streams"

# The input signal's name and payload type: ductor_streams/foundation/signals.py.
