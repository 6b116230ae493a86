"""MCP servers, spoken to with the official ``mcp`` SDK from callers that are not asyncio (the CLI, the engine's
worker, the window through a thread).

The SDK is asyncio; a ``McpManager`` runs it on one background thread (``redline-mcp``) with its own event loop, and
its methods wait for that loop with a timeout. Each server is started on demand, when its tools are first listed
(its tools are then cached), and held open by a task of its own until ``close()``: a stdio server is a child
process (its stderr kept in a temporary file, whose last line the error sentences quote), a Streamable HTTP server
an HTTP session.

Nothing a server does blocks another server or the chat: a server that cannot start (no such command, an exit at
once, no answer to the handshake within ``start_timeout_s``) raises ``McpServerError`` with one sentence; a call
that runs past ``timeout_s`` or whose server dies during it comes back as an error result, and the server is
started again at its next use. ``close()`` stops every server, each within a bounded time.

The ``mcp`` package is imported on the loop's thread when the first server starts, never with this module."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..errors import RedlineError
from .config import ServerSpec

START_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 8.0  # a stdio server: its stdin closed, 2 s to exit, then SIGTERM, 2 s, then SIGKILL
LIST_PAGES = 50  # a server whose tool list never ends stops being read after this many pages


class McpServerError(RedlineError):
    """An MCP server that could not start or list its tools: one sentence naming it."""


@dataclass(frozen=True)
class McpTool:
    """One tool of an MCP server: its name there, what it does, and its arguments' JSON schema."""

    server: str
    name: str
    description: str
    input_schema: dict


@dataclass
class ToolResult:
    """What a tool call gave back: its text (what the model is shown) and whether it is an error."""

    text: str
    is_error: bool = False
    ms: float = 0.0


@dataclass
class _Server:
    spec: ServerSpec
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ready: Optional[asyncio.Future] = None
    task: Optional[asyncio.Task] = None
    client: Any = None
    tools: Optional[list[McpTool]] = None
    stderr: Any = None  # a temporary file holding a stdio server's stderr
    pid: Optional[int] = None


class McpManager:
    """The MCP servers of ``servers``, each started on demand and stopped by ``close()``; thread-safe."""

    def __init__(
        self,
        servers: Sequence[ServerSpec],
        start_timeout_s: float = START_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ):
        self.specs = {s.name: s for s in servers}
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._servers: dict[str, _Server] = {}  # touched on the loop's thread only
        self._holding: set[asyncio.Task] = set()  # every server's task until it ends (one replaced may still stop)
        self._spawning: Optional[asyncio.Lock] = None  # one stdio spawn at a time, so its child is known
        self._closed = False

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    # -- the loop's thread ---------------------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise McpServerError("The MCP servers were stopped.", "Start the chat again to use them.")
            if self._loop is None:
                quiet_sdk_logs()
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_loop, args=(loop,), name="redline-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _wait(self, coro, timeout_s: float):
        """Run ``coro`` on the loop and wait for it (``timeout_s`` and a margin: the coroutine keeps its own)."""
        try:
            loop = self._ensure_loop()
        except BaseException:
            coro.close()
            raise
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("McpManager's methods wait for its own loop; call them from another thread.")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout_s + 5.0)
        except TimeoutError:
            future.cancel()
            raise

    # -- tools -------------------------------------------------------------------------------------------------
    def tools(self, server: str, timeout_s: Optional[float] = None) -> list[McpTool]:
        """``server``'s tools, starting it if it is not running; raises McpServerError with one sentence."""
        if server not in self.specs:
            raise McpServerError(f"There is no MCP server named '{server}'.", "Check the names in mcp.json.")
        timeout = self.start_timeout_s if timeout_s is None else timeout_s
        try:
            return self._wait(self._started(server, timeout), timeout)
        except TimeoutError:
            raise McpServerError(*_start_failure(self.specs[server], f"no answer within {timeout:g} s")) from None

    def all_tools(self, timeout_s: Optional[float] = None) -> tuple[list[McpTool], dict[str, str]]:
        """Every server's tools, the servers started together: (the tools of those that answered, the sentence of
        each that could not start, by name)."""
        timeout = self.start_timeout_s if timeout_s is None else timeout_s

        async def every():
            return await asyncio.gather(*(self._started(n, timeout) for n in self.specs), return_exceptions=True)

        tools: list[McpTool] = []
        errors: dict[str, str] = {}
        if not self.specs:
            return tools, errors
        for name, got in zip(self.specs, self._wait(every(), timeout)):
            if isinstance(got, BaseException):
                errors[name] = (
                    str(got)
                    if isinstance(got, RedlineError)
                    else " ".join(_start_failure(self.specs[name], _why(got, self.specs[name])))
                )
            else:
                tools.extend(got)
        return tools, errors

    def call(self, server: str, tool: str, arguments: dict, timeout_s: Optional[float] = None) -> ToolResult:
        """Call ``tool`` on ``server``; the result's text (``is_error`` where the tool failed, the call ran past
        ``timeout_s``, or the server could not start or stopped during it). Never raises for the server's sake."""
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        try:
            self.tools(server)
            result = self._wait(self._call(server, tool, arguments, timeout), timeout)
        except McpServerError as exc:
            result = ToolResult(str(exc), True)
        except TimeoutError:
            result = ToolResult(_call_timeout(server, tool, timeout), True)
        result.ms = (time.perf_counter() - start) * 1000
        return result

    def pid(self, server: str) -> Optional[int]:
        """The process id of a running stdio server (None: not running, or reached over HTTP)."""
        srv = self._servers.get(server)
        return srv.pid if srv is not None and srv.tools is not None and not srv.stop.is_set() else None

    # -- on the loop ---------------------------------------------------------------------------------------------
    async def _started(self, name: str, timeout: float) -> list[McpTool]:
        srv = self._servers.get(name)
        if srv is not None and (
            srv.stop.is_set() or (srv.ready is not None and srv.ready.done() and srv.ready.exception())
        ):
            srv = None  # stopped, or failed at its last start: start it again
        if srv is None:
            srv = _Server(self.specs[name])
            srv.ready = asyncio.get_running_loop().create_future()
            srv.task = asyncio.create_task(self._hold(srv), name=f"mcp-{name}")
            self._holding.add(srv.task)
            srv.task.add_done_callback(self._holding.discard)
            self._servers[name] = srv
        try:
            return await asyncio.wait_for(asyncio.shield(srv.ready), timeout)
        except asyncio.TimeoutError:
            srv.stop.set()
            if srv.task is not None:
                srv.task.cancel()  # it stops the process in the background; close() waits for that
            raise McpServerError(*_start_failure(srv.spec, f"no answer within {timeout:g} s", srv.stderr)) from None

    async def _hold(self, srv: _Server) -> None:
        """Start ``srv``, list its tools, and hold it open until it is told to stop (the SDK's contexts are entered
        and left in this one task, as anyio requires)."""
        # lazy: the SDK (pydantic models, httpx2, anyio) loads with the first server, on this thread
        from mcp import Client

        ready = srv.ready
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(srv, stack)
                client = Client(transport, client_info=_client_info())
                await stack.enter_async_context(client)
                srv.tools = await _list_tools(client, srv.spec.name)
                srv.client = client
                if not ready.done():
                    ready.set_result(srv.tools)
                await srv.stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(McpServerError(*_start_failure(srv.spec, "its start was stopped", srv.stderr)))
        except BaseException as exc:  # the SDK's own errors, an OSError from the spawn, an ExceptionGroup
            if not ready.done():
                ready.set_exception(McpServerError(*_start_failure(srv.spec, _why(exc, srv.spec), srv.stderr)))
        finally:
            srv.client = None
            srv.stop.set()
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: no "exception never retrieved" at exit
            if srv.stderr is not None:
                srv.stderr.close()

    async def _transport(self, srv: _Server, stack):
        spec = srv.spec
        if spec.url:
            # lazy: with the SDK
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(30.0, read=300.0))
            await stack.enter_async_context(http)
            return streamable_http_client(spec.url, http_client=http)
        # lazy: with the SDK
        from mcp.client.stdio import StdioServerParameters, stdio_client

        srv.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(
            command=os.path.expanduser(spec.command), args=list(spec.args), env=dict(spec.env) or None, cwd=spec.cwd
        )
        if self._spawning is None:
            self._spawning = asyncio.Lock()
        return _Watched(stdio_client(params, errlog=srv.stderr), srv, self._spawning)

    async def _call(self, name: str, tool: str, arguments: dict, timeout: float) -> ToolResult:
        srv = self._servers.get(name)
        client = srv.client if srv is not None else None
        if client is None:
            return ToolResult(f"The MCP server '{name}' is not running.", True)
        mark = _stderr_size(srv.stderr)
        try:
            result = await asyncio.wait_for(client.call_tool(tool, arguments), timeout)
        except asyncio.TimeoutError:
            return ToolResult(_call_timeout(name, tool, timeout), True)
        except Exception as exc:
            # lazy: with the SDK (loaded by now: the server started)
            from mcp.shared.exceptions import MCPError
            from mcp_types import CONNECTION_CLOSED

            if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:  # the server refused the call
                return ToolResult(f"The MCP server '{name}' refused the call to {tool}: {exc.message}", True)
            srv.stop.set()  # it is gone: started again at its next use
            said = _last_line(srv.stderr, mark)
            return ToolResult(
                f"The MCP server '{name}' stopped during the call to {tool}"
                + (f" (it said: {said})" if said else "")
                + ". It will be started again at its next use.",
                True,
            )
        return ToolResult(result_text(result), bool(result.is_error))

    # -- stopping ------------------------------------------------------------------------------------------------
    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every server (each within ``timeout_s``) and the loop's thread; the manager cannot be used again."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None:
            return

        async def stop_all():
            tasks = list(self._holding)
            for s in self._servers.values():
                s.stop.set()
            if tasks:
                done, pending = await asyncio.wait(tasks, timeout=timeout_s)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=STOP_TIMEOUT_S)

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout_s + STOP_TIMEOUT_S + 2.0)
        except (TimeoutError, RuntimeError):
            pass  # a server that will not stop: the thread is a daemon and the process's exit ends it
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5.0)
        if thread is None or not thread.is_alive():
            loop.close()

    def __enter__(self) -> "McpManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Watched:
    """The stdio transport, noting the child's process id (the SDK does not say it), from psutil."""

    def __init__(self, inner, srv: _Server, spawning: asyncio.Lock):
        self.inner, self.srv, self.spawning = inner, srv, spawning

    async def __aenter__(self):
        async with self.spawning:  # entering spawns the process and starts its pipes' tasks: no handshake yet
            before = _children()
            streams = await self.inner.__aenter__()
            new = _children() - before
            self.srv.pid = min(new) if len(new) == 1 else None
        return streams

    async def __aexit__(self, *exc):
        return await self.inner.__aexit__(*exc)


def _children() -> set[int]:
    try:
        # lazy: psutil only where a stdio server starts
        import psutil

        return {p.pid for p in psutil.Process().children()}
    except Exception:
        return set()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def quiet_sdk_logs() -> None:
    """The SDK logs a server's failures with tracebacks; with no handler configured, Python would print them on
    stderr. A null handler keeps them out of the terminal (an application that configures logging still sees
    them)."""
    for name in ("mcp", "httpx2", "httpx"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())


async def _list_tools(client, server: str) -> list[McpTool]:
    tools: list[McpTool] = []
    cursor = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        for t in page.tools:
            schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object", "properties": {}}
            tools.append(McpTool(server, t.name, (t.description or "").strip(), schema))
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def result_text(result) -> str:
    """A ``CallToolResult`` as the text a model reads: its text blocks joined, other blocks named, the structured
    content as JSON where there is no text."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '') or 'data'}]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource: {getattr(res, 'uri', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {getattr(block, 'uri', '')}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _client_info():
    # lazy: with the SDK
    from mcp_types import Implementation

    return Implementation(name="redline", version="0.1.0")


def _why(exc: BaseException, spec: Optional[ServerSpec] = None) -> str:
    """An exception (an ExceptionGroup from the SDK's task groups included) as the clause after "could not start:"."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, McpServerError):
        return exc.message
    if isinstance(exc, FileNotFoundError):
        if spec is not None and spec.cwd and exc.filename == spec.cwd:
            return f"its folder '{spec.cwd}' does not exist"
        return f"the command '{exc.filename or (spec.command if spec else '')}' was not found"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or 'its command'} may not be run (permission denied)"
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if message == "Connection closed":
        return "it exited before answering"
    if type(exc).__name__ in ("ConnectError", "ConnectTimeout"):
        return f"nothing answered at its address ({message})"
    return message.rstrip(".")


def _start_failure(spec: ServerSpec, why: str, stderr=None) -> tuple[str, str]:
    said = _last_line(stderr)
    where = "its address" if spec.url else "its command"
    return (
        f"The MCP server '{spec.name}' could not start: {why}" + (f" (it said: {said})" if said else "") + ".",
        f"Check {where} in mcp.json.",
    )


def _call_timeout(server: str, tool: str, timeout: float) -> str:
    return f"The MCP server '{server}' did not answer the call to {tool} within {timeout:g} s; the call was stopped."


def _stderr_size(stderr) -> int:
    try:
        return os.fstat(stderr.fileno()).st_size if stderr is not None and not stderr.closed else 0
    except (OSError, ValueError):
        return 0


def _last_line(stderr, since: int = 0) -> str:
    """The last line a stdio server wrote on its stderr after its first ``since`` bytes (at most 200 characters)."""
    if stderr is None or stderr.closed:
        return ""
    try:
        fd = stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(since, size - 4000)
        if hasattr(os, "pread"):  # leaves the offset the child writes at alone
            data = os.pread(fd, size - start, start)
        else:
            stderr.seek(start)
            data = stderr.buffer.read() if hasattr(stderr, "buffer") else stderr.read().encode()
    except (OSError, ValueError):
        return ""
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""
