"""The one list of tools offered to a model: every MCP server's tools, named ``server__tool``, and Redline's built-in
ones by their own names, as OpenAI function tools (``GenerationRequest.tools``, the server's ``tools``); a call by
that name goes to the server or the built-in that owns it. ``definition_tokens`` counts what the definitions cost in
the prompt, so the window can show "tools: 1,240 tokens"."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..decoding.tool_calls import fallback_system
from .builtin import BuiltinTools
from .mcp_client import McpManager, McpTool, ToolResult

SEPARATOR = "__"
MAX_NAME = 64  # OpenAI's limit on a function's name
MAX_DESCRIPTION = 1_024  # characters of a tool's description shown to the model (some servers write pages)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class ToolEntry:
    """A tool as the model is offered it (``name``) and where it runs: ``server`` and its own name there (``tool``),
    or a built-in (``server`` None)."""

    name: str
    description: str
    parameters: dict
    server: Optional[str]
    tool: str

    def definition(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def label(self) -> str:
        """Where it comes from, for a person: "echo (MCP)" or "built-in"."""
        return f"{self.server} (MCP)" if self.server else "built-in"


def qualified_name(server: str, tool: str) -> str:
    """``server__tool`` with what a function name may not hold replaced by ``_``, at most 64 characters (a longer one
    keeps its start and a hash of the whole)."""
    name = _UNSAFE.sub("_", server) + SEPARATOR + _UNSAFE.sub("_", tool)
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = name[: MAX_NAME - 9] + "_" + digest
    return name


class ToolRegistry:
    """The tools of ``manager``'s servers (listed by ``refresh``) and of ``builtins``; ``enabled``: the names offered
    (None: all of them)."""

    def __init__(
        self,
        manager: Optional[McpManager] = None,
        builtins: Optional[BuiltinTools] = None,
        enabled: Optional[Iterable[str]] = None,
    ):
        self.manager = manager
        self.builtins = builtins
        self.enabled = set(enabled) if enabled is not None else None
        self.errors: dict[str, str] = {}  # a server that could not start: its sentence
        self._mcp: list[ToolEntry] = []

    def refresh(self, timeout_s: Optional[float] = None) -> dict[str, str]:
        """Lists every server's tools (starting the servers, together); returns the sentence of each server that could
        not start, by name (its tools are then not offered)."""
        if self.manager is None:
            return {}
        tools, self.errors = self.manager.all_tools(timeout_s)
        self._mcp = self._entries(tools)
        return dict(self.errors)

    def add_server_tools(self, tools: Iterable[McpTool]) -> None:
        """Tools listed elsewhere (one server's, listed on a thread of the window's) added to the offer."""
        known = {e.name for e in self._mcp}
        self._mcp += [e for e in self._entries(list(tools)) if e.name not in known]

    @staticmethod
    def _entries(tools: list[McpTool]) -> list[ToolEntry]:
        entries, seen = [], set()
        for t in tools:
            name = qualified_name(t.server, t.name)
            if name in seen:
                continue  # two tools whose names differ only in characters a function name cannot hold
            seen.add(name)
            entries.append(ToolEntry(name, _description(t.description), _parameters(t.input_schema), t.server, t.name))
        return entries

    @property
    def entries(self) -> list[ToolEntry]:
        """Every tool offered: the built-ins first, then each server's in the order it listed them."""
        builtin = []
        if self.builtins is not None:
            for d in self.builtins.definitions():
                fn = d["function"]
                builtin.append(ToolEntry(fn["name"], fn["description"], fn["parameters"], None, fn["name"]))
        every = builtin + self._mcp
        return [e for e in every if self.enabled is None or e.name in self.enabled]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def definitions(self) -> list[dict]:
        """The tools as OpenAI function tools: what a ``GenerationRequest``'s ``tools`` takes."""
        return [e.definition() for e in self.entries]

    def get(self, name: str) -> Optional[ToolEntry]:
        """The tool offered as ``name``; or, where no tool is, the one tool whose own name on its server is ``name``
        (``add`` for ``echo__add``, when no other server has an ``add``)."""
        entries = self.entries
        exact = next((e for e in entries if e.name == name), None)
        if exact is not None:
            return exact
        mine = [
            e for e in entries if e.tool == name or f"{e.server}.{e.tool}" == name or f"{e.server}/{e.tool}" == name
        ]
        return mine[0] if len(mine) == 1 else None

    def call(self, name: str, arguments: dict, timeout_s: Optional[float] = None) -> ToolResult:
        """Run the tool offered as ``name`` (never raises: a failure is an error result the model reads)."""
        entry = self.get(name)
        if entry is None:
            offered = ", ".join(self.names) or "none"
            return ToolResult(f"There is no tool named {name!r}; the tools are: {offered}.", True)
        if entry.server is None:
            return self.builtins.call(entry.tool, arguments)
        return self.manager.call(entry.server, entry.tool, arguments, timeout_s)


def _description(text: str) -> str:
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1].rstrip() + "…"


def _parameters(schema: Any) -> dict:
    """A server's input schema as a function's parameters (an object, whatever the server sent; no keys it does not
    name unless it says otherwise)."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return {"type": "object", "properties": {}}
    out = {k: v for k, v in schema.items() if k not in ("$schema", "title")}
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    # A model writes the arguments the tool takes and no others (the call grammar enforces the schema; JSON Schema
    # would otherwise let it add keys of its own).
    out.setdefault("additionalProperties", False)
    return out


def definition_tokens(tools: list[dict], tokenizer, native: bool = False) -> int:
    """How many prompt tokens ``tools``'s definitions take for ``tokenizer``: in the model's own template (``native``:
    a conversation rendered with them less one without), or in Redline's fallback system message, which is how the
    tool loop shows them to a local model."""
    if not tools:
        return 0
    if native and getattr(tokenizer, "chat_template", None):
        probe = [{"role": "user", "content": "Hi"}]
        with_tools = tokenizer.apply_chat_template(probe, tools=tools, tokenize=True, add_generation_prompt=True)
        without = tokenizer.apply_chat_template(probe, tokenize=True, add_generation_prompt=True)
        return max(0, len(_ids(with_tools)) - len(_ids(without)))
    return len(tokenizer(fallback_system(tools), add_special_tokens=False)["input_ids"])


def _ids(rendered) -> list:
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        return list(rendered["input_ids"])
    return list(rendered)
