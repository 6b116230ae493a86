"""The OpenAI-compatible HTTP API over the engine service (FastAPI on uvicorn; server-sent events from
sse-starlette): the application, its endpoints and its error handlers.

Every request becomes a ``GenerationRequest`` on the one ``EngineService`` the chat window (or ``redline
serve``) owns, so API clients and the window share the model, and fast-path requests are decoded together
(continuous batching). The prompt is made ready before the request queues (``preparation.py``), so a request that
does not fit the context is refused (400) and its ``usage`` is exact; the answers are ``streaming.py``'s.

Answers: ``GET /v1/models``; ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/responses``
(``responses.py``), streamed or not,
with real ``usage`` and a llama.cpp-style ``timings`` object. Errors are OpenAI's error object; nothing
else (no traceback) ever goes out. A client that disconnects cancels its generation at the next decode
step.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
import uuid
from typing import Any, Optional

from fastapi import Request

from ..errors import Busy, RedlineError, Refused
from ..events import Failed, FinishedEvent, GenerationResult
from ..generation.request import GenerationRequest
from . import messages, responses, streaming
from .config import ServerConfig
from .embeddings import EmbeddingsRequest, embeddings_job, embeddings_response
from .middleware import BodyLimit
from .preparation import Preparation
from .protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    FieldError,
    describe_validation,
    error_body,
)
from .stats import ServerStats

RETRY_AFTER_S = 1


STOPPED = "Redline's server was stopped"


class Api:
    """What the endpoints share: the service, the limits, the stats, the request preparation, and the replies in
    flight (told when the server stops, so each ends with an error event instead of a cut connection)."""

    def __init__(self, service, config: ServerConfig, stats: Optional[ServerStats] = None):
        self.service = service
        self.config = config
        self.stats = stats or ServerStats()
        self.preparation = Preparation(service, config)
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Any, asyncio.Queue]] = {}  # handle id → (its loop, its event queue)
        self.closing: Optional[str] = None  # why the server stops, once it does

    # -- stopping -----------------------------------------------------------------------------------------
    def close(self, reason: str = STOPPED) -> None:
        """Any thread: every reply in flight ends now with a 503 saying ``reason`` (its generation cancelled); a
        request arriving from now on gets the same 503."""
        with self._lock:
            self.closing = reason
            live = list(self._live.values())
        for loop, queue in live:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, streaming.Closing(reason))
            except RuntimeError:  # its loop is closed already
                pass

    def in_flight(self) -> int:
        with self._lock:
            return len(self._live)

    def track(self, handle, loop, queue) -> None:
        with self._lock:
            if self.closing is None:
                self._live[handle.id] = (loop, queue)
                return
        loop.call_soon_threadsafe(queue.put_nowait, streaming.Closing(self.closing))

    def untrack(self, handle) -> None:
        with self._lock:
            self._live.pop(handle.id, None)

    def check_open(self) -> None:
        if self.closing is not None:
            raise ApiError(503, streaming.closing_message(self.closing), code="server_stopped")

    def check_key(self, request) -> None:
        key = self.config.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
            scheme, token = "bearer", request.headers.get("x-api-key", "")
        if not token or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                401,
                "Missing or wrong API key. Send the key this server was started with as 'Authorization: Bearer …' "
                "(or 'x-api-key: …').",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def models(self) -> dict:
        target = self.service.target
        data = []
        if target is not None and target.capabilities.servable:
            data.append(
                {
                    "id": target.name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "redline",
                    "max_model_len": target.context_limit,
                    "precision": target.precision.label(),
                    "device": target.device,
                }
            )
        return {"object": "list", "data": data}

    def submit(self, request: GenerationRequest):
        try:
            return self.service.submit(request)
        except Busy as exc:
            raise ApiError(
                429, f"{exc}", code="rate_limit_exceeded", headers={"Retry-After": str(RETRY_AFTER_S)}
            ) from None
        except Refused as exc:
            raise ApiError(400, str(exc), code="context_length_exceeded") from None
        except RedlineError as exc:
            raise ApiError(503, str(exc)) from None


def build_app(service, config: ServerConfig, stats: Optional[ServerStats] = None, api: Optional[Api] = None):
    """The ASGI application (FastAPI) serving ``service`` under ``config`` (through ``api``, when given, so its
    owner can ``close`` it)."""
    # lazy: the server's libraries load only when it starts
    from fastapi import FastAPI

    # lazy: the server's libraries load only when it starts
    from fastapi.exceptions import RequestValidationError

    # lazy: the server's libraries load only when it starts
    from fastapi.responses import JSONResponse

    # lazy: the server's libraries load only when it starts
    from sse_starlette.sse import EventSourceResponse

    # lazy: the server's libraries load only when it starts
    from starlette.exceptions import HTTPException as StarletteHTTPException

    api = api or Api(service, config, stats)
    app = FastAPI(title="Redline", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.api = api

    def error_response(exc: ApiError, request=None) -> JSONResponse:
        if request is not None and request.url.path.endswith("/messages"):  # Anthropic's clients read their shape
            return JSONResponse(messages.error_body(exc.status, exc.message), exc.status, headers=exc.headers)
        return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), exc.status, headers=exc.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc):
        message, param = describe_validation(list(exc.errors()))
        return error_response(ApiError(400, message, param), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc):
        if exc.status_code == 404:
            msg = (
                f"There is no {request.url.path} here. "
                "Redline serves /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and "
                "/v1/embeddings."
            )
        elif exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path}."
        else:
            msg = str(exc.detail)
        return error_response(ApiError(exc.status_code, msg), request)

    @app.exception_handler(Exception)
    async def _anything(request, exc):  # a bug of ours: a sentence, never a traceback
        failed = ApiError(500, f"Redline's server failed on this request ({type(exc).__name__}).")
        return error_response(failed, request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.target.name if service.target is not None else None}

    @app.get("/v1/models")
    async def models(request: Request):
        api.check_key(request)
        return api.models()

    def launch(gen: GenerationRequest, streamed: bool):
        """Queue ``gen``; its events come to the returned queue on this loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        handle = api.submit(gen)
        api.stats.begin()

        def forward(event):  # the scheduler's thread
            if isinstance(event, FinishedEvent):
                api.stats.end(event.result.finish_reason, event.result.new_tokens, streamed)
            elif isinstance(event, Failed):
                api.stats.end("error", 0, streamed)
            loop.call_soon_threadsafe(queue.put_nowait, event)

        handle.subscribe(forward)
        api.track(handle, loop, queue)
        return handle, queue

    async def complete(request: Request, chat: bool):
        api.check_key(request)
        api.check_open()
        body = await api.preparation.read(request, ChatCompletionRequest if chat else CompletionRequest)
        target, gen, tools = await api.preparation.prepare(body, chat)
        n = body.n or 1
        extra = [(await api.preparation.prepare(body, chat, choice=i))[1] for i in range(1, n)]
        runs = [launch(gen, bool(body.stream))]
        try:
            runs += [launch(g, bool(body.stream)) for g in extra]  # decoded together by the batcher
        except ApiError:
            for h, _ in runs:  # a full queue for the later choices: none of them runs
                h.cancel()
                api.untrack(h)
            raise
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        name = target.name
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(
                streaming.stream(api, runs, ident, created, name, chat, include_usage, tools),
                sep="\n",
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await streaming.whole(api, runs, request, ident, created, name, chat, tools)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, False)

    async def as_chat(request: Request, kind, convert):
        """A request of another API (Responses, Messages) read, converted to chat's by ``convert`` and prepared as
        chat's are, then launched: (its body, the target, the tools, the handle, its event queue)."""
        # lazy: pydantic loads only when this runs
        from pydantic import ValidationError

        api.check_key(request)
        api.check_open()
        body = await api.preparation.read(request, kind)
        try:
            chat_body = convert(body)
        except FieldError as exc:
            raise ApiError(400, exc.message, exc.field) from None
        except ValidationError as exc:
            message, param = describe_validation(exc.errors(include_url=False))
            raise ApiError(400, message, param) from None
        problem = chat_body.unsupported()
        if problem is not None:
            raise ApiError(400, problem[1], problem[0], "unsupported_parameter")
        target, gen, tools = await api.preparation.prepare(chat_body, True)
        handle, queue = launch(gen, body.stream)
        return body, target, tools, handle, queue

    @app.post("/v1/responses")
    async def responses_api(request: Request):
        body, target, tools, handle, queue = await as_chat(request, responses.ResponsesRequest, responses.chat_request)
        answer = responses.Answer(body, target.name)
        if body.stream:
            return EventSourceResponse(
                responses.events(api, handle, queue, answer, tools),
                sep="\n",
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        result = await streaming.collect(api, handle, queue, request)
        if not isinstance(result, GenerationResult):
            return result
        return responses.whole(answer, result, tools)

    @app.post("/v1/messages")
    async def messages_api(request: Request):
        body, target, tools, handle, queue = await as_chat(request, messages.MessagesRequest, messages.chat_request)
        if body.stream:
            return EventSourceResponse(
                messages.events(api, handle, queue, body, target.name, tools),
                sep="\n",
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        result = await streaming.collect(api, handle, queue, request)
        if not isinstance(result, GenerationResult):
            return result
        return messages.whole(body, target.name, result, tools)

    @app.post("/v1/embeddings")
    async def embeddings_api(request: Request):
        api.check_key(request)
        api.check_open()
        body = await api.preparation.read(request, EmbeddingsRequest)
        texts = body.texts()
        if body.dimensions is not None:
            raise ApiError(400, "dimensions is not supported: the embedding has the model's hidden size.", "dimensions")
        try:
            handle = service.call(embeddings_job(texts), "embeddings")
            vectors, tokens, name = await asyncio.to_thread(handle.result, 600)
        except RedlineError as exc:
            raise ApiError(400, str(exc), "input") from None
        return embeddings_response(vectors, tokens, name, body.encoding_format)

    wrapped: Any = app
    if config.cors_origins:
        # lazy: the server's libraries load only when it starts
        from starlette.middleware.cors import CORSMiddleware

        wrapped = CORSMiddleware(
            wrapped,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return BodyLimit(wrapped, config.max_body_bytes)
