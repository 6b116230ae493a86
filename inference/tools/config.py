"""The MCP servers a user lists, read from an ``mcp.json`` in the format of Claude Desktop and LM Studio::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"],
                  "env": {"DEBUG": "0"}},
        "web": {"url": "http://127.0.0.1:8931/mcp", "headers": {"Authorization": "Bearer …"}}
    }}

A server with ``command`` (and ``args``, ``env``, ``cwd``) is started here and spoken to over its stdin/stdout; one
with ``url`` (and ``headers``) is reached over Streamable HTTP. ``"type"`` may say which (``"stdio"``, ``"http"``;
Cursor and VS Code write it) and ``"disabled": true`` leaves a server out. Other top-level keys are ignored (Claude
Desktop's file holds its other settings there); an unknown key inside a server is refused, since a misspelt
``"agrs"`` would otherwise start the server without its arguments.

A file that cannot be used raises ``McpConfigError``: one sentence naming the file and what is wrong (the line and
column of bad JSON), never a traceback."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import RedlineError

FILE_NAME = "mcp.json"
SERVER_KEYS = ("command", "args", "env", "cwd", "url", "headers", "type", "disabled")
STDIO_TYPES = ("stdio",)
HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


class McpConfigError(RedlineError):
    """An ``mcp.json`` that cannot be used: the sentence names the file and what is wrong in it."""


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server as listed: started with ``command`` (stdio) or reached at ``url`` (Streamable HTTP)."""

    name: str
    command: Optional[str] = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    url: Optional[str] = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def describe(self) -> str:
        """The server as a person reads it: its command line or its address."""
        if self.url:
            return self.url
        return " ".join([self.command or "", *self.args]).strip()


def read_mcp_config(path: str | Path, missing_ok: bool = False) -> list[ServerSpec]:
    """The servers listed in the file at ``path`` (``missing_ok``: none when it does not exist, as for the default
    file in the config folder); raises McpConfigError."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return []
        raise McpConfigError(f"{path} does not exist.", "Check the path of the mcp.json file.") from None
    except IsADirectoryError:
        raise McpConfigError(f"{path} is a folder, not an mcp.json file.", "Name the file itself.") from None
    except UnicodeDecodeError:
        raise McpConfigError(f"{path} is not UTF-8 text.", "Save it as UTF-8 JSON.") from None
    except OSError as exc:
        raise McpConfigError(f"{path} could not be read ({exc.strerror or exc}).", "Check its permissions.") from None
    return parse_mcp_config(text, str(path))


def parse_mcp_config(text: str, source: str = FILE_NAME) -> list[ServerSpec]:
    """The servers listed in ``text`` (an mcp.json's content; ``source`` names it in errors)."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(
            f"{source} is not valid JSON: {exc.msg.lower()} at line {exc.lineno}, column {exc.colno}.",
            "Fix the file (a missing comma or quote, or a trailing comma, is the usual cause).",
        ) from None
    if not isinstance(data, dict):
        raise McpConfigError(
            f"{source} holds a JSON {_kind(data)}, not an object.",
            'Write {"mcpServers": {"name": {"command": …}}}.',
        )
    servers = data.get("mcpServers")
    if servers is None:
        other = next((k for k in data if k.lower() in ("mcpservers", "mcp_servers", "servers")), None)
        hint = f'Rename "{other}" to "mcpServers".' if other else 'List the servers under "mcpServers".'
        raise McpConfigError(f'{source} has no "mcpServers" object.', hint)
    if not isinstance(servers, dict):
        raise McpConfigError(
            f'"mcpServers" in {source} is a JSON {_kind(servers)}, not an object of servers by name.',
            'Write "mcpServers": {"name": {"command": …}}.',
        )
    specs = []
    for name, entry in servers.items():
        spec = _server(name, entry, source)
        if spec is not None:
            specs.append(spec)
    return specs


def _server(name: str, entry: Any, source: str) -> Optional[ServerSpec]:
    where = f'The server "{name}" in {source}'
    if not name.strip():
        raise McpConfigError(f"A server in {source} has an empty name.", "Give each server a name.")
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} is a JSON {_kind(entry)}, not an object.", 'Write {"command": …} or {"url": …}.')
    unknown = [k for k in entry if k not in SERVER_KEYS]
    if unknown:
        raise McpConfigError(
            f'{where} has an unknown key "{unknown[0]}".',
            f"The keys a server takes are {', '.join(SERVER_KEYS)}.",
        )
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise McpConfigError(f'"disabled" of {_lower(where)} is not true or false.', "Write true or false.")
    if disabled:
        return None
    kind = entry.get("type")
    if kind is not None and kind not in STDIO_TYPES + HTTP_TYPES:
        if kind == "sse":
            raise McpConfigError(
                f"{where} uses the old SSE transport, which Redline does not speak.",
                "Use the server's Streamable HTTP address (often …/mcp) or its stdio command.",
            )
        raise McpConfigError(f'{where} has an unknown "type" {kind!r}.', 'Use "stdio" or "http".')
    command, url = entry.get("command"), entry.get("url")
    if command is not None and url is not None:
        raise McpConfigError(f'{where} has both "command" and "url".', "Keep the one that starts or reaches it.")
    if command is None and url is None:
        raise McpConfigError(
            f'{where} has neither "command" nor "url".',
            'Give the command that starts it ("command", "args") or its address ("url").',
        )
    if url is not None:
        if kind in STDIO_TYPES:
            raise McpConfigError(f'{where} says "type": "stdio" but gives a "url".', 'Give its "command" instead.')
        _string(url, "url", where)
        if not re.match(r"https?://[^\s/]+", url):
            raise McpConfigError(f'The "url" of {_lower(where)} is not an http:// or https:// address.', "Fix it.")
        extra = [k for k in ("args", "env", "cwd") if k in entry]
        if extra:
            raise McpConfigError(
                f'{where} has a "url" and "{extra[0]}", which only a started server (a "command") takes.',
                "Remove one of them.",
            )
        return ServerSpec(name, url=url, headers=_strings(entry.get("headers", {}), "headers", where))
    if kind in HTTP_TYPES:
        raise McpConfigError(f'{where} says "type": "{kind}" but gives a "command".', 'Give its "url" instead.')
    _string(command, "command", where)
    if "headers" in entry:
        raise McpConfigError(f'{where} has "headers", which only a server at a "url" takes.', "Remove them.")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        raise McpConfigError(f'"args" of {_lower(where)} is not a list of strings.', 'Write "args": ["…", "…"].')
    cwd = entry.get("cwd")
    if cwd is not None:
        _string(cwd, "cwd", where)
    env = _strings(entry.get("env", {}), "env", where)
    return ServerSpec(name, command=command, args=tuple(str(a) for a in args), env=env, cwd=cwd)


def _string(value: Any, key: str, where: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise McpConfigError(f'"{key}" of {_lower(where)} is not a non-empty string.', f'Write "{key}": "…".')


def _strings(value: Any, key: str, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise McpConfigError(f'"{key}" of {_lower(where)} is not an object.', f'Write "{key}": {{"NAME": "value"}}.')
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise McpConfigError(
                f'"{key}" of {_lower(where)} gives "{k}" a {_kind(v)}, not a string.', "Quote the value."
            )
        out[str(k)] = str(v)
    return out


def _lower(where: str) -> str:
    return where[0].lower() + where[1:]


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(type(value), "value")
