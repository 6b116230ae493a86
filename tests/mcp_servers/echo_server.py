"""A tiny stdio MCP server for the tests (the official SDK's server side, ``MCPServer``, which mcp 2 calls what
mcp 1 called FastMCP): a few tools that answer, one that sleeps forever, one that ends the process mid-call.

``python echo_server.py``: serve on stdin/stdout. ``--crash-at-start``: exit before reading anything (a server that
dies at once). ``--hang-at-start``: never answer (a server stuck before its handshake). ``--http PORT``: serve
Streamable HTTP on 127.0.0.1:PORT instead (not used by the tests, which run the app in-process)."""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated

import anyio
from mcp.server.mcpserver import MCPServer
from pydantic import Field

server = MCPServer("echo")

Small = Annotated[int, Field(ge=0, le=999)]


@server.tool()
def add(a: Small, b: Small) -> str:
    """Add two whole numbers from 0 to 999."""
    return str(a + b)


@server.tool()
def shout(text: Annotated[str, Field(max_length=40)]) -> str:
    """The text in capitals."""
    return text.upper()


@server.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
async def hang() -> str:
    """Never answers (until the call is cancelled)."""
    await anyio.sleep_forever()
    return ""


@server.tool()
def crash() -> str:
    """Ends this server's process in the middle of the call."""
    os._exit(3)


@server.tool()
def fail() -> str:
    """A tool that raises: the result is an error the model sees."""
    raise ValueError("the disk is on fire")


if __name__ == "__main__":
    if "--crash-at-start" in sys.argv:
        print("echo_server: refusing to start", file=sys.stderr)
        sys.exit(2)
    if "--hang-at-start" in sys.argv:
        while True:
            time.sleep(3600)
    server.run()
