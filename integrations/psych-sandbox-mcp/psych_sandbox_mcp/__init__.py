"""psych-sandbox-mcp: MCP in both directions for psych-sandbox.

:class:`McpBindings` makes every tool of the deployment's upstream MCP servers a tool a
program may call (:func:`connect_upstreams` opens them from the configuration's ``[mcp]``
section); ``psych-sandbox mcp`` (:mod:`.server`) serves ``run_python`` as an MCP server.
See the core's mcp.md.
"""

from .bindings import BinaryKeeper, KeptBinary, McpBindings, UpstreamOptions, connect_upstreams

__all__ = ["BinaryKeeper", "KeptBinary", "McpBindings", "UpstreamOptions", "connect_upstreams"]
__version__ = "0.2.0"
