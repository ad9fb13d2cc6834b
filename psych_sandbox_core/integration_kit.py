"""The integration kit: what a distribution that puts the sandbox in front of another
framework (psych-sandbox-mcp, psych-sandbox-pydantic-ai, psych-sandbox-smolagents) imports
from the core beside its public API.

An integration is a front end, like the command line: it runs programs through ``Sandbox``
and hands their results to a model in the framework's shape. What it needs beyond the public
names is here, and only that: the answer a model reads and its cuts, a tool's one-line
listing, the windows output is paged in, the limits a tool listing must keep, and the
deployment configuration's ``[mcp]`` section.

That section stays the core's schema, validated when the configuration loads (with every other
setting, by ``config_problems``) whether or not the MCP integration is installed: a
configuration that can never work fails at load on every host that reads it, never at the
first ``psych-sandbox mcp``. It follows the backend kit's compatibility policy (see
kit/__init__.py): an integration declares the core's minor series it was built against.
"""

from __future__ import annotations

from ._api.provider_shapes import DEFAULT_MAX_CHARS, cut_text, report_text
from ._bindings.catalogue import tool_line
from ._engine.program import given_variables
from ._output.attachments import DEFAULT_WINDOW_BYTES, MAX_WINDOW_BYTES
from ._policy.config import ConfigSource, parse_config
from ._policy.mcp_settings import HttpUpstream, McpSettings, StdioUpstream
from .protocol.limits import MAX_TOOL_NAME_CHARS, MAX_TOOLS

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_WINDOW_BYTES",
    "MAX_TOOLS",
    "MAX_TOOL_NAME_CHARS",
    "MAX_WINDOW_BYTES",
    "ConfigSource",
    "HttpUpstream",
    "McpSettings",
    "StdioUpstream",
    "cut_text",
    "given_variables",
    "parse_config",
    "report_text",
    "tool_line",
]
