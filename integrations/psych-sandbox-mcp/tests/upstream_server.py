"""A Python MCP server (the SDK's MCPServer, formerly FastMCP) used as an upstream in tests.

Run as ``python upstream_server.py stdio``, or ``python upstream_server.py http`` for
streamable HTTP on a free loopback port, whose number it prints on stdout once listening.
Further arguments are ignored: tests pass a marker to find the process in /proc.
"""

from __future__ import annotations

import base64
import socket
import sys
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

#: A 1x1 PNG, small enough to check byte for byte.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)

server: MCPServer[Any] = MCPServer("test-upstream", log_level="WARNING")


@server.tool(name="list-orders", structured_output=False)
def list_orders(page: int) -> str:
    """Orders of one page, as JSON text: ten per page, three pages."""
    import json

    if page >= 3:
        return "[]"
    return json.dumps([{"id": page * 10 + i, "amount": page * 10 + i} for i in range(10)])


@server.tool()
def stats(values: list[float]) -> dict[str, float]:
    """Sum and mean of the values (structured content)."""
    return {"sum": sum(values), "mean": sum(values) / len(values) if values else 0.0}


@server.tool(structured_output=False)
def big(size: int) -> str:
    """A text of exactly size characters, the last one "!"."""
    return "x" * (size - 1) + "!"


@server.tool(structured_output=False)
def fail(reason: str) -> str:
    """Always fails, with the reason."""
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(reason)


@server.tool(name="pixel", structured_output=False)
def pixel() -> Any:
    """A 1x1 PNG image."""
    from mcp.server.mcpserver.utilities.types import Image

    return Image(data=PIXEL, format="png")


@server.tool(name="delete-everything", structured_output=False)
def delete_everything() -> str:
    """Would need a person's approval. Leaves a file named by $UPSTREAM_RAN_FILE when run, so
    a test can see from outside whether it ever ran."""
    import os

    ran = os.environ.get("UPSTREAM_RAN_FILE")
    if ran:
        with open(ran, "w") as fh:
            fh.write("ran")
    return "deleted"


class Confirmation(BaseModel):
    sure: bool


def ask_a_person() -> Elicit[Confirmation]:
    return Elicit("Really?", Confirmation)


@server.tool(name="confirm-with-person", structured_output=False)
def confirm_with_person(answer: Annotated[Confirmation, Resolve(ask_a_person)]) -> str:
    """Asks a person (an elicitation) before it answers."""
    return f"sure: {answer.sure}"


@server.tool(name="withdraw", structured_output=False)
def withdraw(tool: str) -> str:
    """Stop offering a tool."""
    server.remove_tool(tool)
    return f"withdrew {tool}"


def main() -> None:
    if sys.argv[1] == "stdio":
        server.run("stdio")
        return
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    print(listener.getsockname()[1], flush=True)
    web = uvicorn.Server(
        uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    )
    anyio.run(lambda: web.serve(sockets=[listener]))


if __name__ == "__main__":
    main()
