"""The window's tools, without a widget: the MCP servers of the user's ``mcp.json`` (one ``McpManager`` for the
window, each server started on demand on a thread that is never the UI thread, and each one's status: not started,
its tools, or the sentence that says why it could not start), Redline's built-in tools as Settings → Tools has them,
the approval rules (``ApprovalPolicy``, kept in the approvals file) and the list of tools one reply is offered.

Both paths are handed in by the application (``app/gui.py``: ``mcp.json`` and ``tool-approvals.json`` in Redline's
config folder); ``ui`` never reads them from anywhere else. Listing a server waits on the manager's own thread, so
it runs on a worker thread (``redline-tools-list``, or the reply's own ``redline-tools``) and says what it found to
the UI thread through a queued signal."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from PySide6.QtCore import QObject, Qt, Signal, Slot

from ...inference import (
    ApprovalPolicy,
    BuiltinTools,
    McpConfigError,
    McpManager,
    McpTool,
    RedlineError,
    ServerSpec,
    ToolRegistry,
    read_mcp_config,
)
from ..signals import emit

START_TIMEOUT_S = 15.0  # a server's start and handshake
CALL_TIMEOUT_S = 60.0  # one call
CLOSE_WAIT_S = 3.0  # how long the window's close waits for the servers to stop (they are stopped on a thread)

NOT_STARTED, STARTING, READY, FAILED = "not started", "starting", "ready", "failed"


def tools_count(n: int) -> str:
    return f"{n} tool" if n == 1 else f"{n} tools"


class ToolsService(QObject):
    """The MCP servers of ``mcp_path`` and the approval rules of ``approvals_path`` (None: none, and rules kept in
    memory); ``settings()``: the settings in use (the built-in tools' fields)."""

    changed = Signal()  # the servers, their statuses or the config changed (on the UI thread)
    _posted = Signal()  # from a worker thread: the statuses changed

    def __init__(
        self,
        mcp_path: Optional[Path],
        approvals_path: Optional[Path],
        settings: Callable[[], Any],
        parent: Optional[QObject] = None,
        start_timeout_s: float = START_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ):
        super().__init__(parent)
        self.mcp_path = Path(mcp_path) if mcp_path is not None else None
        self.approvals_path = Path(approvals_path) if approvals_path is not None else None
        self.settings = settings
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        # A tool the first round must call (None: the model chooses), as the API's tool_choice: a hook for tests and
        # tools, not a setting.
        self.tool_choice: Optional[str] = None
        self._lock = threading.Lock()
        self.specs: list[ServerSpec] = []
        self.config_error: Optional[str] = None  # mcp.json could not be used: its sentence
        self.manager: Optional[McpManager] = None
        self._generation = 0  # a listing from an earlier mcp.json is dropped
        self._tools: dict[str, list[McpTool]] = {}
        self._errors: dict[str, str] = {}
        self._starting: set[str] = set()
        self._closing: list[threading.Thread] = []
        self.closed = False
        self.policy, self.policy_error = self._load_policy()
        self._posted.connect(self._announce, Qt.QueuedConnection)
        self.load_config()

    # -- mcp.json ---------------------------------------------------------------------------------------------------
    def load_config(self) -> None:
        """Read mcp.json again (after it was edited): a new set of servers, none started; the old ones are stopped on
        a thread. A file that cannot be used leaves no servers and its sentence in ``config_error``."""
        specs: list[ServerSpec] = []
        error = None
        if self.mcp_path is not None:
            try:
                specs = read_mcp_config(self.mcp_path, missing_ok=True)
            except McpConfigError as exc:
                error = str(exc)
        with self._lock:
            old = self.manager
            self._generation += 1
            self.specs, self.config_error = specs, error
            self._tools, self._errors, self._starting = {}, {}, set()
            self.manager = (
                McpManager(specs, start_timeout_s=self.start_timeout_s, call_timeout_s=self.call_timeout_s)
                if specs and not self.closed
                else None
            )
        if old is not None:
            self._close_later(old)
        emit(self.changed)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def status(self, name: str) -> tuple[str, str]:
        """(state, what a person reads) of the server ``name``: not started, starting…, "3 tools", or the sentence
        saying why it could not start."""
        with self._lock:
            if name in self._starting:
                return STARTING, "starting…"
            if name in self._errors:
                return FAILED, self._errors[name]
            if name in self._tools:
                return READY, tools_count(len(self._tools[name]))
        return NOT_STARTED, "not started"

    @property
    def errors(self) -> dict[str, str]:
        with self._lock:
            return dict(self._errors)

    @property
    def starting(self) -> bool:
        """Some server is being started and listed now."""
        with self._lock:
            return bool(self._starting)

    def listed(self) -> bool:
        """Every server has been listed or has failed (no listing is needed before a reply)."""
        with self._lock:
            return all(n in self._tools or n in self._errors for n in self.names)

    # -- listing (never on the UI thread) ----------------------------------------------------------------------------
    def list_in_background(self, retry: bool = True) -> None:
        """Start the servers and list their tools on a thread (``retry``: those that failed too); ``changed`` says
        what came of it."""
        threading.Thread(target=self.ensure_listed, args=(retry,), name="redline-tools-list", daemon=True).start()

    def ensure_listed(self, retry: bool = False) -> None:
        """Start and list every server not listed yet (``retry``: and those that failed), together; waits for them
        (at most the start timeout). A worker thread's call: it blocks."""
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("the MCP servers are listed on a worker thread, never on the UI thread")
        with self._lock:
            manager, generation = self.manager, self._generation
            missing = [n for n in self.names if n not in self._tools and (retry or n not in self._errors)]
            if manager is None or not missing:
                return
            self._starting |= set(missing)
        emit(self._posted)
        try:
            tools, errors = manager.all_tools()
        except Exception as exc:  # the manager was closed meanwhile (mcp.json edited, the window closing), a timeout
            tools, errors = [], {n: str(exc) if isinstance(exc, RedlineError) else f"{n}: {exc}" for n in missing}
        by_server: dict[str, list[McpTool]] = {}
        for t in tools:
            by_server.setdefault(t.server, []).append(t)
        with self._lock:
            if generation == self._generation:
                for name in missing:
                    self._starting.discard(name)
                    if name in errors:
                        self._errors[name] = errors[name]
                        self._tools.pop(name, None)
                    else:
                        self._errors.pop(name, None)
                        self._tools[name] = by_server.get(name, [])
        emit(self._posted)

    @Slot()
    def _announce(self) -> None:
        emit(self.changed)

    # -- what a reply is offered ---------------------------------------------------------------------------------------
    def builtins(self) -> Optional[BuiltinTools]:
        """Redline's own tools as Settings → Tools has them (None: neither is on)."""
        s = self.settings()
        calculator = bool(getattr(s, "tools_calculator", True))
        paths = tuple(getattr(s, "tools_read_paths", ()) or ())
        if not calculator and not paths:
            return None
        return BuiltinTools(allowed=paths, calculator=calculator)

    def registry(self, unticked: Iterable[str] = ()) -> ToolRegistry:
        """The tools one reply is offered, as listed now: the built-ins, then each server's (a server that failed
        offers none; its sentence is in ``errors``), less those ``unticked`` in its conversation."""
        with self._lock:
            manager = self.manager
            listed = [t for n in self.names for t in self._tools.get(n, [])]
            errors = dict(self._errors)
        registry = ToolRegistry(manager, self.builtins())
        registry.add_server_tools(listed)
        registry.errors = errors
        unticked = set(unticked)
        if unticked:
            registry.enabled = {n for n in registry.names if n not in unticked}
        return registry

    # -- approvals -----------------------------------------------------------------------------------------------------
    def _load_policy(self) -> tuple[ApprovalPolicy, Optional[str]]:
        try:
            return ApprovalPolicy.load(self.approvals_path), None
        except RedlineError as exc:  # unreadable: kept as it is; this session's rules are kept in memory only
            return ApprovalPolicy(), str(exc)

    def set_trust(self, server: str, trust: str) -> None:
        """A server's trust (ask, always, never), saved in the approvals file."""
        self.policy.set_server(server, trust)

    def forget_tool_rules(self) -> None:
        """Every tool's remembered "always" or "never" is forgotten (each call is asked about again)."""
        for name in list(self.policy.tools):
            self.policy.set_tool(name, "once", save=False)
        self.policy.save()

    # -- stopping ------------------------------------------------------------------------------------------------------
    def _close_later(self, manager: McpManager) -> None:
        thread = threading.Thread(target=manager.close, name="redline-tools-close", daemon=True)
        thread.start()
        self._closing.append(thread)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Stop every server (on a thread), waiting at most ``wait_s`` for them; True if they all stopped in time.
        A server that takes longer is stopped by its thread, or ends with the process."""
        with self._lock:
            self.closed = True
            manager, self.manager = self.manager, None
            self._generation += 1
        if manager is not None:
            self._close_later(manager)
        return self.wait_closed(wait_s)

    def wait_closed(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        for thread in self._closing:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._closing = [t for t in self._closing if t.is_alive()]
        return not self._closing
