"""Which tool calls run without asking: the user's rule per tool — ``once`` (ask each time, the default),
``always``, ``never`` — and per MCP server a trust default, ``ask`` unless the user set it to ``always`` or
``never``; a tool's own rule wins over its server's. Kept as a small JSON file (its path given by the application):

    {"version": 1, "tools": {"echo__add": "always"}, "servers": {"files": "ask"}}
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..errors import RedlineError

ONCE, ALWAYS, NEVER = "once", "always", "never"
ASK = "ask"
TOOL_RULES = (ONCE, ALWAYS, NEVER)
SERVER_TRUST = (ASK, ALWAYS, NEVER)
ALLOW, DENY = "allow", "deny"  # and ASK: what ``decide`` says of a call


@dataclass
class PendingCall:
    """A call the model made, waiting for the user's word: the tool as offered (``name``), its server (None: a
    built-in), its arguments (a dict; the text as sent when it was not JSON)."""

    name: str
    arguments: dict
    server: Optional[str] = None
    id: str = ""
    raw_arguments: str = ""

    def shown(self, limit: int = 300) -> str:
        """``name({"path": "…"})``, as a person is asked to allow it."""
        args = self.raw_arguments or json.dumps(self.arguments, ensure_ascii=False)
        if len(args) > limit:
            args = args[: limit - 1] + "…"
        return f"{self.name}({args})"


@dataclass
class ApprovalPolicy:
    """The rules, read from ``path`` (None: kept in memory only) and written back by ``save``."""

    path: Optional[Path] = None
    tools: dict[str, str] = field(default_factory=dict)
    servers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Optional[str | Path]) -> "ApprovalPolicy":
        """The rules saved at ``path`` (none where it does not exist; a file that cannot be read: RedlineError)."""
        if path is None:
            return cls()
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            raise RedlineError(
                f"The tool approvals in {path} could not be read ({exc}).", "Delete the file to start over."
            ) from None
        if not isinstance(data, dict):
            raise RedlineError(f"The tool approvals in {path} are not a JSON object.", "Delete the file to start over.")
        tools = {k: v for k, v in (data.get("tools") or {}).items() if v in TOOL_RULES}
        servers = {k: v for k, v in (data.get("servers") or {}).items() if v in SERVER_TRUST}
        return cls(path, tools, servers)

    def save(self) -> None:
        """Written atomically (a file of its own replaced whole), readable by this user alone."""
        if self.path is None:
            return
        data = {"version": 1, "tools": dict(sorted(self.tools.items())), "servers": dict(sorted(self.servers.items()))}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".approvals-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    # -- the rules ----------------------------------------------------------------------------------------------
    def tool_rule(self, name: str) -> str:
        return self.tools.get(name, ONCE)

    def set_tool(self, name: str, rule: str, save: bool = True) -> None:
        if rule not in TOOL_RULES:
            raise ValueError(f"A tool's rule is one of {', '.join(TOOL_RULES)}, not {rule!r}.")
        if rule == ONCE:
            self.tools.pop(name, None)
        else:
            self.tools[name] = rule
        if save:
            self.save()

    def server_trust(self, server: str) -> str:
        return self.servers.get(server, ASK)

    def set_server(self, server: str, trust: str, save: bool = True) -> None:
        if trust not in SERVER_TRUST:
            raise ValueError(f"A server's trust is one of {', '.join(SERVER_TRUST)}, not {trust!r}.")
        if trust == ASK:
            self.servers.pop(server, None)
        else:
            self.servers[server] = trust
        if save:
            self.save()

    def decide(self, call: PendingCall) -> str:
        """``allow``, ``deny`` or ``ask`` for ``call``: its tool's rule, else its server's trust, else ask."""
        rule = self.tools.get(call.name)
        if rule == ALWAYS:
            return ALLOW
        if rule == NEVER:
            return DENY
        trust = self.server_trust(call.server) if call.server else ASK
        return {ALWAYS: ALLOW, NEVER: DENY}.get(trust, ASK)

    def approver(self, ask: Callable[[PendingCall], str]) -> Callable[[PendingCall], bool]:
        """The ``approve(call) -> bool`` the tool loop takes: the rules first, then ``ask(call)``, which returns what
        the user chose — ``yes`` (this once), ``no``, ``always`` or ``never`` (both remembered for the tool)."""

        def approve(call: PendingCall) -> bool:
            decided = self.decide(call)
            if decided != ASK:
                return decided == ALLOW
            answer = ask(call)
            if answer in (ALWAYS, NEVER):
                self.set_tool(call.name, answer)
            return answer in ("yes", ALWAYS)

        return approve
