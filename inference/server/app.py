"""The OpenAI-compatible HTTP API over the engine service (FastAPI on uvicorn; server-sent events from
sse-starlette).

Every request becomes a ``GenerationRequest`` on the one ``EngineService`` the chat window (or ``redline
serve``) owns, so API clients and the window share the model, and fast-path requests are decoded together
(continuous batching). The prompt is built here, with the server's own copy of the model's tokenizer, so a
request that does not fit the context is refused (400) before it queues, and its ``usage`` is exact.

Answers: ``GET /v1/models``; ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed or not,
with real ``usage`` and a llama.cpp-style ``timings`` object. Errors are OpenAI's error object; nothing
else (no traceback) ever goes out. A client that disconnects cancels its generation at the next decode
step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from collections import deque
from typing import Any, Optional

from fastapi import Request

from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.errors import Busy, ContextExceeded, RedlineError, Refused
from redline.inference.events import Failed, FinishedEvent, GenerationResult, TokenEvent
from redline.inference.generation.request import GenerationRequest, Prepared, prepare
from redline.inference.server.config import ServerConfig
from redline.inference.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    describe_validation,
    error_body,
)
from redline.inference.server.structured import GrammarProcessor, GrammarTokenizers, SchemaError, grammar_for

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "error": "error"}
RETRY_AFTER_S = 1


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None, headers=None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


class ServerStats:
    """What the window's status bar shows: requests in flight, tokens/s over the last seconds, and the
    ends of recent requests (for tests and the log). Thread-safe."""

    WINDOW_S = 2.0

    def __init__(self):
        self._lock = threading.Lock()
        self.active = 0
        self.requests = 0
        self.errors = 0
        self._tokens: deque = deque()
        self.recent: deque = deque(maxlen=256)  # (finish_reason, new_tokens, streamed)

    def begin(self) -> None:
        with self._lock:
            self.active += 1
            self.requests += 1

    def end(self, finish_reason: str, new_tokens: int, streamed: bool) -> None:
        with self._lock:
            self.active -= 1
            if finish_reason == "error":
                self.errors += 1
            self.recent.append((finish_reason, new_tokens, streamed))

    def token(self, n: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            self._tokens.append((now, n))
            while self._tokens and now - self._tokens[0][0] > self.WINDOW_S:
                self._tokens.popleft()

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._tokens and now - self._tokens[0][0] > self.WINDOW_S:
                self._tokens.popleft()
            return sum(n for _, n in self._tokens) / self.WINDOW_S


class _Tokenizers:
    """The server's own copy of the loaded model's tokenizer (the engine's is its thread's alone), used under a
    lock from the request threads: chat templates, prompt lengths, the grammar's vocabulary."""

    def __init__(self):
        self._lock = threading.Lock()
        self._for: Any = None
        self._tok: Any = None

    def get(self, target):
        with self._lock:
            if self._for is not target:
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(target.folder))
                self._for = target
            return self._tok

    def prepare(self, target, request: GenerationRequest, new_tokens_asked: bool) -> Prepared:
        """The request made ready as the engine would (``generation.request.prepare``), strictly: a conversation
        that does not fit is refused, not shortened."""
        tok = self.get(target)
        with self._lock:
            return prepare(tok, target.context_limit, request, strict=True, new_tokens_asked=new_tokens_asked)

    def encode(self, target, text: str) -> list[int]:
        tok = self.get(target)
        with self._lock:
            return list(tok(text, add_special_tokens=True)["input_ids"])


def timings(result: GenerationResult) -> dict:
    """llama.cpp's ``timings`` object from Redline's measurements, plus TTFT and the time spent queued.

    prompt_ms: from the start of work on the request to its first token (prefill; the queue excluded);
    predicted_*: the decode, tokens after the first over their time (Redline's decode tokens/s)."""
    ttft = result.ttft_ms or 0.0
    queued = result.queued_ms or 0.0
    prompt_ms = max(ttft - queued, 0.0)
    decoded = max(result.new_tokens - 1, 0)
    per_s = result.tokens_per_s or 0.0
    predicted_ms = decoded / per_s * 1000 if per_s else 0.0
    return {
        "prompt_n": result.prompt_tokens,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / result.prompt_tokens, 3) if result.prompt_tokens else 0.0,
        "prompt_per_second": round(result.prompt_tokens / prompt_ms * 1000, 3) if prompt_ms else 0.0,
        "predicted_n": result.new_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(1000 / per_s, 3) if per_s else 0.0,
        "predicted_per_second": round(per_s, 3),
        "ttft_ms": round(ttft, 3),
        "queued_ms": round(queued, 3),
        "draft_n": result.draft_proposed or 0,
        "draft_n_accepted": result.draft_accepted or 0,
    }


def usage(result: GenerationResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
    }


class Api:
    def __init__(self, service, config: ServerConfig, stats: Optional[ServerStats] = None):
        self.service = service
        self.config = config
        self.stats = stats or ServerStats()
        self.tokenizers = _Tokenizers()
        self.grammars = GrammarTokenizers()
        self._switch = asyncio.Lock()

    # -- the model --------------------------------------------------------------------------------------
    def _target(self):
        engine = self.service.engine
        target = getattr(engine, "target", None)
        if target is None:
            raise ApiError(
                503,
                "No model is loaded in Redline. Load one in the window, or start `redline serve --model …`.",
                code="model_not_loaded",
            )
        if not target.capabilities.servable:
            raise ApiError(
                503,
                f"Redline is connected to a remote server ({target.name}), which it does not pass on. "
                "Load a local model to serve it.",
                code="model_not_loaded",
            )
        return target

    @staticmethod
    def _names(target) -> set[str]:
        source = getattr(target, "source", None)
        names = {target.name}
        if source is not None:
            names.add(source.spec)
        return names

    async def _model_for(self, wanted: str):
        target = getattr(self.service.engine, "target", None)
        if target is not None and target.capabilities.servable and wanted in self._names(target):
            return target
        if not self.config.load_on_request:
            target = self._target()  # none loaded, or a remote one: the clear 503
            raise ApiError(
                404,
                f"The model '{wanted}' is not loaded; this server has '{target.name}'. Name that model, or start "
                "the server with --allow-model-load to load others on request.",
                "model",
                "model_not_found",
            )
        async with self._switch:  # one load at a time: two requests for the same model load it once
            target = getattr(self.service.engine, "target", None)
            if target is not None and wanted in self._names(target):
                return target
            try:
                handle = self.service.load(wanted, self.config.precision, interrupt=False)
                await asyncio.to_thread(handle.result, 3600)
            except RedlineError as exc:
                raise ApiError(
                    404, f"The model '{wanted}' could not be loaded: {exc}", "model", "model_not_found"
                ) from None
            return self._target()

    # -- a request --------------------------------------------------------------------------------------
    async def read(self, request, kind):
        try:
            raw = await request.body()
        except _BodyTooLarge:
            limit = self.config.max_body_bytes
            raise ApiError(413, f"The request body is larger than this server's limit of {limit:,} bytes.") from None
        try:
            data = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"The request body is not valid JSON ({exc}).") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        from pydantic import ValidationError

        try:
            body = kind.model_validate(data)
        except ValidationError as exc:
            message, param = describe_validation(exc.errors(include_url=False))
            raise ApiError(400, message, param) from None
        problem = body.unsupported()
        if problem is not None:
            raise ApiError(400, problem[1], problem[0], "unsupported_parameter")
        return body

    def check_key(self, request) -> None:
        key = self.config.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                401,
                "Missing or wrong API key. Send the key this server was started with as 'Authorization: Bearer …'.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def models(self) -> dict:
        engine = self.service.engine
        target = getattr(engine, "target", None)
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

    async def prepare(self, body, chat: bool) -> tuple[Any, GenerationRequest]:
        target = await self._model_for(body.model)
        where = "messages" if chat else "prompt"
        wanted = body.wanted_tokens()
        cap = self.config.max_tokens_cap
        field = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
        if wanted is not None and wanted > cap:
            raise ApiError(400, f"{field} {wanted} is above this server's limit of {cap}. Ask for fewer.", field)
        sampling = SamplingSettings(
            max_new_tokens=wanted if wanted is not None else (cap if chat else 16),  # completions' default is 16
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            repetition_penalty=body.repetition_penalty,
            seed=body.seed,
            stop=body.stops(),
        )
        prompt: dict = {}
        try:
            if chat:
                prompt["messages"] = [
                    {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
                ]
            elif isinstance(body.prompt, list) and (not body.prompt or isinstance(body.prompt[0], int)):
                prompt["input_ids"] = [int(t) for t in body.prompt]
            else:
                text = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
                prompt["input_ids"] = await asyncio.to_thread(self.tokenizers.encode, target, text)
            request = GenerationRequest(
                **prompt, sampling=sampling, options=DecodeOptions(self.config.strategy), client="api"
            )
            request.prepared = await asyncio.to_thread(self.tokenizers.prepare, target, request, wanted is not None)
        except ContextExceeded as exc:
            if exc.what == "max_new_tokens":
                raise ApiError(
                    400,
                    f"{field} {wanted} plus the prompt's {exc.prompt_tokens} tokens exceed the model's context of "
                    f"{exc.limit}; ask for at most {exc.room}.",
                    field,
                    "context_length_exceeded",
                ) from None
            raise ApiError(
                400,
                f"The prompt has {exc.prompt_tokens or 'too many'} tokens, which fills the model's context of "
                f"{exc.limit or target.context_limit}. Shorten it.",
                where,
                "context_length_exceeded",
            ) from None
        except RedlineError as exc:
            raise ApiError(400, str(exc), where) from None
        if chat and body.response_format is not None and body.response_format.type != "text":
            request.logits_processor = await asyncio.to_thread(self._grammar, target, body.response_format.as_dict())
        return target, request

    def _grammar(self, target, response_format: dict):
        try:
            grammar = grammar_for(response_format)
        except SchemaError as exc:
            raise ApiError(400, str(exc), "response_format") from None
        except Exception as exc:  # the library's own refusal of the schema
            raise ApiError(400, f"The JSON schema cannot be enforced: {exc}", "response_format") from None
        if grammar is None:
            return None
        tok = self.tokenizers.get(target)
        vocab = getattr(target.model.config, "vocab_size", None) if target.model is not None else None
        lltok = self.grammars.get(tok, vocab)
        return GrammarProcessor(lltok, grammar)

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


class _BodyTooLarge(Exception):
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
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, limited, sending)
        except _BodyTooLarge:
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


def build_app(service, config: ServerConfig, stats: Optional[ServerStats] = None):
    """The ASGI application (FastAPI) serving ``service`` under ``config``."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from sse_starlette.sse import EventSourceResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    api = Api(service, config, stats)
    app = FastAPI(title="Redline", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.api = api

    def error_response(exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), exc.status, headers=exc.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc):
        message, param = describe_validation(list(exc.errors()))
        return error_response(ApiError(400, message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc):
        if exc.status_code == 404:
            msg = (
                f"There is no {request.url.path} here. "
                "Redline serves /v1/models, /v1/chat/completions and /v1/completions."
            )
        elif exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path}."
        else:
            msg = str(exc.detail)
        return error_response(ApiError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def _anything(request, exc):  # a bug of ours: a sentence, never a traceback
        return error_response(ApiError(500, f"Redline's server failed on this request ({type(exc).__name__})."))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": getattr(getattr(service.engine, "target", None), "name", None)}

    @app.get("/v1/models")
    async def models(request: Request):
        api.check_key(request)
        return api.models()

    async def complete(request: Request, chat: bool):
        api.check_key(request)
        body = await api.read(request, ChatCompletionRequest if chat else CompletionRequest)
        target, gen = await api.prepare(body, chat)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        handle = api.submit(gen)
        api.stats.begin()
        streamed = bool(body.stream)

        def forward(event):  # the scheduler's thread
            if isinstance(event, FinishedEvent):
                api.stats.end(event.result.finish_reason, event.result.new_tokens, streamed)
            elif isinstance(event, Failed):
                api.stats.end("error", 0, streamed)
            loop.call_soon_threadsafe(queue.put_nowait, event)

        handle.subscribe(forward)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        name = target.name
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(
                _stream(api, handle, queue, ident, created, name, chat, include_usage),
                sep="\n",
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _whole(api, handle, queue, request, ident, created, name, chat)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, False)

    wrapped: Any = app
    if config.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        wrapped = CORSMiddleware(
            wrapped,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return BodyLimit(wrapped, config.max_body_bytes)


def _failure(result: GenerationResult) -> tuple[int, str]:
    """A generation that ended without its answer, its client still there: it failed (500), or the engine
    stopped it for something else (503: a model load in the window, Redline closing)."""
    if result.finish_reason == "cancelled":
        why = next((n for n in reversed(result.notes) if n.startswith("Stopped")), "Stopped by Redline.")
        return 503, f"The reply was stopped before its end: {why} Send the request again."
    return 500, f"The generation failed: {result.error}"


def _chunk(ident, created, name, chat: bool, text: Optional[str], finish: Optional[str], first=False) -> dict:
    if chat:
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {"id": ident, "object": kind, "created": created, "model": name, "choices": [choice]}


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


async def _stream(api: Api, handle, queue, ident, created, name, chat, include_usage):
    result: Optional[GenerationResult] = None
    try:
        if chat:
            yield _data(_chunk(ident, created, name, chat, "", None, first=True))
        while True:
            event = await queue.get()
            if isinstance(event, TokenEvent):
                if event.token_id >= 0:
                    api.stats.token()
                if event.text:
                    yield _data(_chunk(ident, created, name, chat, event.text, None))
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, Failed):
                yield _data(error_body(500, f"The generation failed: {event.message}"))
                yield {"data": "[DONE]"}
                return
        if result.finish_reason in ("error", "cancelled"):
            yield _data(error_body(*_failure(result)))
            yield {"data": "[DONE]"}
            return
        last = _chunk(ident, created, name, chat, None if chat else "", FINISH[result.finish_reason])
        if not include_usage:
            last["timings"] = timings(result)
        yield _data(last)
        if include_usage:
            tail = {
                "id": ident,
                "object": last["object"],
                "created": created,
                "model": name,
                "choices": [],
                "usage": usage(result),
                "timings": timings(result),
            }
            yield _data(tail)
        yield {"data": "[DONE]"}
    finally:
        # The client went away (this task is cancelled) or the stream ended: this request alone stops, at the
        # engine's next decode step (a no-op once it has finished).
        handle.cancel()


async def _whole(api: Api, handle, queue, request, ident, created, name, chat):
    from fastapi.responses import JSONResponse

    async def gone():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(gone())
    result, failure = None, None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                getter.cancel()
                handle.cancel()  # the client left: stop at the next decode step
                return JSONResponse(error_body(400, "The client disconnected."), 400)
            event = getter.result()
            if isinstance(event, TokenEvent) and event.token_id >= 0:
                api.stats.token()
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, Failed):
                failure = event.message
                break
    finally:
        watcher.cancel()
        if result is None:
            handle.cancel()
    if failure is not None:
        return JSONResponse(error_body(500, f"The generation failed: {failure}"), 500)
    if result.finish_reason in ("error", "cancelled"):
        status, message = _failure(result)
        return JSONResponse(error_body(status, message), status)
    finish = FINISH[result.finish_reason]
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": None,
            "finish_reason": finish,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {
        "id": ident,
        "object": kind,
        "created": created,
        "model": name,
        "choices": [choice],
        "usage": usage(result),
        "timings": timings(result),
    }
