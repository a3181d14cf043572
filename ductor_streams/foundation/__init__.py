"""The foundation every layer may use: stream definitions, metrics, tracing, logs,
redaction, the input signal, heap trimming. Imports nothing of the layers above
(docs/architecture.md). Kept free of imports: the workflow helpers import
``foundation.signals`` inside Temporal's sandbox."""
