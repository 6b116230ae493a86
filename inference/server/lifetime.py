"""The server's lifetime: uvicorn on a thread of its own with its own event loop, so neither the window's
UI thread nor the engine's scheduler thread ever runs HTTP. ``redline serve`` and the window's Server
switch both use ``ApiServer``.

The listening socket is bound here, before uvicorn starts, so a port in use is a clear sentence and port 0
picks a free one (tests, benchmarks).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Optional

from .config import ServerConfig, ServerConfigError
from .stats import ServerStats

DRAIN_S = 1.0  # at most this long for the replies in flight to send their last event when the server stops


class ApiServer:
    def __init__(self, service, config: Optional[ServerConfig] = None, on_thread_start=None):

        self.service = service
        self.config = config or ServerConfig()
        # Called first on the server's thread (the window lowers its priority there, as for the engine's
        # thread, so the UI thread gets a core first; threads the server starts inherit it).
        self._on_thread_start = on_thread_start
        self.stats = ServerStats()
        self.port: Optional[int] = None
        self._server = None
        self._api = None  # the endpoints' shared state (routes.Api): told first when the server stops
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    # -- what the window shows ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def address(self) -> str:
        host = self.config.host
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{shown}:{self.port}/v1"

    def status(self) -> dict:
        return {
            "running": self.running,
            "address": self.address if self.port else None,
            "active": self.stats.active,
            "tokens_per_s": self.stats.tokens_per_s(),
            "requests": self.stats.requests,
            "errors": self.stats.errors,
            "exposed": self.config.exposed,
        }

    # -- starting and stopping ------------------------------------------------------------------------
    def _bind(self) -> socket.socket:
        host, port = self.config.host.strip("[]"), int(self.config.port)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise ServerConfigError(
                    f"Port {port} on {host} is already in use by another program.", "Choose another port (--port)."
                ) from None
            raise ServerConfigError(
                f"Cannot listen on {host}:{port} ({exc.strerror or exc}).", "Check the address (--host)."
            ) from None
        sock.listen(128)
        sock.set_inheritable(True)
        return sock

    def start(self, timeout: float = 20.0) -> str:
        """Listen and serve; returns the address (``http://HOST:PORT/v1``). Raises ServerConfigError."""
        # lazy: the server's libraries load only when it starts
        import uvicorn

        # lazy: routes imports fastapi (the server's libraries load only when it starts)
        from .routes import Api, build_app

        if self.running:
            return self.address
        self.config.validate()
        sock = self._bind()
        self.port = sock.getsockname()[1]
        self._api = Api(self.service, self.config, self.stats)
        app = build_app(self.service, self.config, self.stats, self._api)
        uv_config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,  # a request line is enough to leak a prompt in a query; none is logged
            lifespan="off",
            # A backstop only: the replies in flight have ended (stop() tells them first) before uvicorn is asked to
            # exit, so its graceful shutdown finds nothing left to wait for.
            timeout_graceful_shutdown=1,
            timeout_keep_alive=5,
            server_header=False,
        )
        self._server = uvicorn.Server(uv_config)
        self._error = None

        def serve():
            try:
                if self._on_thread_start is not None:
                    self._on_thread_start()
                self._server.run(sockets=[sock])
            except BaseException as exc:  # reported by start() or status, never raised on this thread
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=serve, name="redline-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop(2)
                raise ServerConfigError(f"The server did not start: {self._error or 'it took too long'}.")
            time.sleep(0.02)
        return self.address

    def stop(self, timeout: float = 5.0, reason: Optional[str] = None) -> bool:
        """Stop listening. Every reply in flight ends first, with a 503 error saying ``reason`` (by default, that the
        server was stopped) and, when streamed, ``[DONE]``, and its generation is cancelled; then uvicorn exits.
        True if it stopped within ``timeout``."""
        # lazy: routes imports fastapi (the server's libraries load only when it starts)
        from .routes import STOPPED

        server, thread, api = self._server, self._thread, self._api  # stop() may run on two threads at once
        if server is None or thread is None:
            return True
        if api is not None:
            api.close(reason or STOPPED)
            deadline = time.monotonic() + min(DRAIN_S, timeout)
            while api.in_flight() and time.monotonic() < deadline:  # their last events go out
                time.sleep(0.01)
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(1.0)
        stopped = not thread.is_alive()
        if stopped and self._thread is thread:
            self._thread = None
        return stopped
