"""ASGI middleware of the server: the body size limit (413 before the rest is read), and the last guard, which keeps
a bug's traceback out of the log once its one-sentence 500 has gone out."""

from __future__ import annotations

import json
import logging

from .protocol import error_body

log = logging.getLogger("redline.server")


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is refused with 413, by its Content-Length or as it
    streams in, before the rest is read."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        seen = 0
        started = False

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge()
            return message

        try:
            await self.app(scope, limited, sending)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)
        except Exception as exc:
            # Starlette re-raises what the app's error handler has answered (a bug of ours: the client has its
            # one-sentence 500), so that servers log its traceback; one line is logged instead, never a traceback.
            log.warning("Redline's server failed on a request (%s: %s).", type(exc).__name__, exc)
            if not started:
                await self._answer(send, 500, f"Redline's server failed on this request ({type(exc).__name__}).")

    async def _refuse(self, send):
        await self._answer(send, 413, f"The request body is larger than this server's limit of {self.limit:,} bytes.")

    @staticmethod
    async def _answer(send, status: int, message: str):
        body = json.dumps(error_body(status, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
