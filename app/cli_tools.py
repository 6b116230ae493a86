"""`redline chat` with tools: MCP servers from an mcp.json (``--mcp``), Redline's built-in tools (``--builtin-tools``,
``--allow-read``), each call allowed on the terminal or ahead (``--allow-tool``), a call forced (``--tool-choice``),
the loop bounded (``--max-tool-rounds``); ``--json`` records every call and its result (docs/chat.md, "Tools and MCP
servers"). The loop itself is the engine's (``redline.inference``'s ``run_tool_loop``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..inference import (
    ApprovalPolicy,
    BuiltinTools,
    GenerationRequest,
    McpManager,
    RedlineError,
    ServiceGenerator,
    ToolRegistry,
    read_mcp_config,
    run_tool_loop,
    tool_tokens_job,
)
from .cli_args import at_least, whole_number
from .private_files import config_dir

CHOICES = ("auto", "required", "none")
RESULT_SHOWN = 160  # characters of a result printed on the terminal
RECORD_RESULT = 2_000  # characters of a result in --json


def default_mcp_path() -> Path:
    """``mcp.json`` in Redline's config folder (the window's Settings edit the same file)."""
    return config_dir(create=False) / "mcp.json"


def approvals_path() -> Path:
    """Where the window keeps the user's answers to tool calls (``ApprovalPolicy``: "Always allow" per tool, each
    server's trust), beside mcp.json."""
    return config_dir(create=False) / "tool-approvals.json"


def add_tool_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group('tools (docs/chat.md, "Tools and MCP servers")')
    g.add_argument(
        "--mcp",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="offer the tools of the MCP servers listed in FILE (Claude Desktop's and LM Studio's mcp.json format); "
        f"--mcp alone: {default_mcp_path()}",
    )
    g.add_argument(
        "--builtin-tools", action="store_true", help="offer Redline's calculate tool (and read_file, with --allow-read)"
    )
    g.add_argument(
        "--allow-read",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or folder the read_file tool may read (repeatable; offers read_file)",
    )
    g.add_argument(
        "--tool",
        action="append",
        default=None,
        metavar="NAME",
        help="offer only this tool (repeatable; server__tool, or its own name where only one server has it): fewer "
        "definitions, a shorter prompt",
    )
    g.add_argument(
        "--allow-tool",
        action="append",
        default=[],
        metavar="NAME",
        help="run this tool's calls without asking (repeatable; server__tool, or a tool's own name where only one "
        "server has it); other calls are asked on the terminal, and refused when stdin is not one",
    )
    g.add_argument(
        "--tool-choice",
        metavar="NAME",
        help="auto (default), required (the first reply must call a tool), none, or a tool's name (the first reply "
        "calls it), as the API's tool_choice",
    )
    g.add_argument(
        "--max-tool-rounds",
        default=8,
        help="at most this many replies in a row with tool calls (default 8)",
        **whole_number(1),
    )
    g.add_argument(
        "--tool-timeout",
        default=60.0,
        help="seconds an MCP tool call may take (default 60)",
        **at_least(0.1, "a call needs some time"),
    )


def uses_tools(args) -> bool:
    """Whether ``args`` ask for tools (else the chat runs as it always did)."""
    return bool(
        getattr(args, "mcp", None) is not None
        or getattr(args, "builtin_tools", False)
        or getattr(args, "allow_read", [])
        or getattr(args, "tool_choice", None)
        or getattr(args, "tool", None)
    )


class ToolSession:
    """The chat's tools, made once (the servers started together, before the first reply) and closed with it."""

    def __init__(self, args):
        self.manager = None
        specs = []
        if args.mcp is not None:
            specs = read_mcp_config(Path(args.mcp) if args.mcp else default_mcp_path(), missing_ok=not args.mcp)
            if not specs:
                print("note: no MCP servers are listed in the mcp.json file", file=sys.stderr)
        builtins = None
        if args.builtin_tools or args.allow_read:
            builtins = BuiltinTools(allowed=args.allow_read, calculator=args.builtin_tools)
        if specs:
            self.manager = McpManager(specs, call_timeout_s=args.tool_timeout)
        self.registry = ToolRegistry(self.manager, builtins)
        for error in self.registry.refresh().values():
            print(f"note: {error}", file=sys.stderr)
        if args.tool:
            self.registry.enabled = {_offered(self.registry, name, "--tool") for name in args.tool}
        self.policy = ApprovalPolicy()  # in memory: "always" holds for this chat; --allow-tool for every run
        for name in args.allow_tool:
            entry = self.registry.get(name)
            if entry is None:
                print(f"note: --allow-tool {name}: no tool offered has that name", file=sys.stderr)
            else:
                self.policy.set_tool(entry.name, "always", save=False)
        self.choice = resolve_choice(self.registry, args.tool_choice)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


def resolve_choice(registry: ToolRegistry, choice: str | None) -> str | None:
    if choice is None or choice in CHOICES:
        return choice
    return _offered(registry, choice, "--tool-choice")


def _offered(registry: ToolRegistry, name: str, flag: str) -> str:
    """The name ``name`` is offered as (``add`` → ``echo__add``), or RedlineError naming the tools there are."""
    entry = registry.get(name)
    if entry is None:
        offered = ", ".join(registry.names) or "none"
        raise RedlineError(f"{flag} names {name!r}, which is not offered; the tools are: {offered}.")
    return entry.name


def session(args) -> ToolSession:
    made = getattr(args, "tool_session", None)
    if made is None:
        made = ToolSession(args)
        args.tool_session = made
    return made


def close_tools(args) -> None:
    """Stops the chat's MCP servers (each within a few seconds); nothing where none were started."""
    made = getattr(args, "tool_session", None)
    if made is not None:
        made.close()
        args.tool_session = None


def ask_on_terminal(call, stdin=None, err=None) -> str:
    """The user's word on ``call``: "yes", "no" or "always" (a terminal's answer), "no" when stdin is not one."""
    stdin = stdin or sys.stdin
    err = err or sys.stderr
    if not getattr(stdin, "isatty", lambda: False)():
        print(
            f"note: {call.name} was not run: it is not allowed ahead (--allow-tool {call.name}) and stdin is not a "
            "terminal to ask on",
            file=err,
        )
        return "no"
    while True:
        err.write(f"Allow {call.shown()}? [y]es / [n]o / [a]lways: ")
        err.flush()
        line = stdin.readline()
        if not line:
            err.write("\n")
            return "no"
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            return "yes"
        if answer in ("n", "no", ""):
            return "no"
        if answer in ("a", "always"):
            return "always"


def run_with_tools(service, messages: list[dict], args):
    """One turn with tools: the loop on ``service`` from ``messages``, its replies streamed, each call asked about or
    allowed ahead; returns the last reply's GenerationResult. Appends to ``messages`` what the turn added before its
    last reply (the assistant's calls and the tool results), so the caller appends the answer as it does without
    tools; ``tool_record(result)`` is what ``--json`` adds."""
    # lazy: cli_chat imports this module (a cycle); its printer and request settings are shared
    from .cli_chat import ReplyPrinter, options_from_args, sampling_from_args, thinking_from_args

    tools = session(args)
    printer = ReplyPrinter(hide=getattr(args, "hide_thinking", False))
    quiet = args.json

    def request(request_messages: list[dict]) -> GenerationRequest:
        return GenerationRequest(
            messages=request_messages,
            sampling=sampling_from_args(args),
            options=options_from_args(args),
            context=args.context,
            client="cli",
            thinking=thinking_from_args(args),
        )

    generator = ServiceGenerator(
        service,
        tools.registry.definitions(),
        request,
        tool_choice=tools.choice,
        on_event=None if quiet else printer,
    )

    def on_call(call) -> None:
        printer.end()
        if not quiet:
            print(f"\n[{call.shown(120)} …]", file=sys.stderr)

    def on_result(record) -> None:
        if quiet:
            return
        text = " ".join(record.result.split())
        text = text if len(text) <= RESULT_SHOWN else text[: RESULT_SHOWN - 1] + "…"
        if record.ran:
            verdict = "error: " if record.is_error else "→ "
            print(f"[{record.name} {verdict}{text} ({record.ms:.0f} ms)]", file=sys.stderr)
        else:
            print(f"[{record.name} not run: {text}]", file=sys.stderr)

    loop = run_tool_loop(
        generator,
        messages,
        tools.registry,
        tools.policy.approver(ask_on_terminal),
        max_rounds=args.max_tool_rounds,
        on_call=on_call,
        on_result=on_result,
        timeout_s=args.tool_timeout,
    )
    printer.end()
    for note in generator.notes:
        print(f"note: {note}", file=sys.stderr)
    final = loop.final
    if final is None:
        raise RedlineError("The reply was stopped before it started.")
    if loop.stopped == "max_rounds":
        print(
            f"note: stopped after {args.max_tool_rounds} replies with tool calls (--max-tool-rounds)", file=sys.stderr
        )
        final = replace(final, text=loop.answer)
    if final.finish_reason != "error":
        added = loop.messages[:-1] if loop.stopped is None else loop.messages
        messages.extend(added)
    final.tool_record = _record(service, tools, loop)
    return final


def _record(service, tools: ToolSession, loop) -> dict:
    definitions = tools.registry.definitions()
    try:
        tokens = service.call(tool_tokens_job(definitions), "the tools' size").result() if definitions else 0
    except RedlineError:
        tokens = None
    return {
        "tools": {"offered": tools.registry.names, "tokens": tokens, "errors": dict(tools.registry.errors)},
        "tool_calls": [c.to_dict(RECORD_RESULT) for c in loop.calls],
        "tool_rounds": [
            {
                "prompt_tokens": r.prompt_tokens,
                "new_tokens": r.new_tokens,
                "finish_reason": r.finish_reason,
                "ttft_ms": r.ttft_ms,
                "text": r.text,
            }
            for r in loop.results
        ],
        "tool_messages": loop.messages,
        "tools_stopped": loop.stopped,
    }


def tool_record(result) -> dict:
    """What ``--json`` adds for a turn with tools (nothing for one without)."""
    return getattr(result, "tool_record", None) or {}


def open_tools(args) -> None:
    """The chat's tools made ready before the model loads, so a bad mcp.json fails at once (nothing without tools)."""
    if uses_tools(args):
        session(args)
