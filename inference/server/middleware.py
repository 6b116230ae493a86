"""ASGI middleware of the server: the body size limit (413 before the rest is read)."""

from __future__ import annotations

import json

from redline.inference.server.protocol import error_body


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

    async def _refuse(self, send):
        body = json.dumps(
            error_body(413, f"The request body is larger than this server's limit of {self.limit:,} bytes.")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
