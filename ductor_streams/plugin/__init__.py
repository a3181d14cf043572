"""The Temporal side: ``StreamsPlugin`` (client and worker) and, in ``plugin.workflow``,
the helpers that workflow code uses (import those inside the sandbox)."""

from ductor_streams.plugin._plugin import PLUGIN_NAME, StreamsPlugin

__all__ = ["PLUGIN_NAME", "StreamsPlugin"]
