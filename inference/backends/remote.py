"""A remote engine: a model behind an OpenAI-compatible server (vLLM, llama.cpp's server, SGLang, TGI,
Ollama, ``transformers serve``, another Redline), used like a local model.

``connect(spec)`` checks the server and picks the model; the ``RemoteModel`` it returns stands where a
``LoadedModel`` stands (``engine.target``), so chat, the CLI and the speed lab reach it through the same
engine service. Each reply is one streamed ``POST /chat/completions`` (httpx): the text deltas become
``TokenEvent``s, TTFT and decode tokens/s are measured here, on the client, and the server's own figures
(``usage``; llama.cpp's ``timings``; vLLM's usage in the stream) are kept beside them.

A model spec for a server is its base URL, optionally with the model after ``#``:
``http://127.0.0.1:8080/v1`` (the server's only or first model) or ``http://gpu-box:8000/v1#Qwen/Qwen2.5-7B``.
Every failure — unreachable, 401, unknown model, 5xx, a timeout, the connection dropped mid-stream — is one
sentence; a reply cut short keeps what had arrived (``finish_reason="error"`` with the text so far).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlsplit

from ..attachments import wire
from ..decoding.timing import fill_timing
from ..errors import RedlineError, UnsupportedConfiguration
from ..events import GenerationResult, Started, TokenEvent
from .base import Backend, Capabilities

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0  # the longest silence accepted from a server mid-reply (a long prompt's prefill)
DEFAULT_CONTEXT = 32768  # when the server does not say
UNKNOWN_TOKEN = -2  # TokenEvent.token_id for a remote token: the server sends text, not ids
_CONTEXT_REFUSAL = "The server's context cannot hold that many new tokens: "

STEP_WAIT_S = 0.02  # how long the scheduler waits on replies in flight before it looks at its queue again
SERVER_STOPS = 4  # stop strings a request gives an OpenAI-compatible server (OpenAI refuses more)


class RemoteError(RedlineError):
    """A server could not be used: unreachable, refused the key, has no such model, failed."""


def is_server_url(spec: Optional[str]) -> bool:
    return bool(spec) and spec.strip().lower().startswith(("http://", "https://"))


def parse_server_spec(spec: str) -> tuple[str, Optional[str]]:
    """``URL[#MODEL]`` → (base URL without a trailing slash, the model or None)."""
    url, _, model = spec.strip().partition("#")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(
            f"{spec!r} is not a server address.", "Write it as http://HOST:PORT/v1 (add #MODEL to pick a model)."
        )
    if parts.query:
        raise RemoteError(
            f"The server address {url!r} has a query string.", "Give the base URL, e.g. http://HOST:PORT/v1."
        )
    return url.rstrip("/"), (model.strip() or None)


def display_url(base_url: str) -> str:
    """host:port of a base URL (what the status bar and the memory gauge name)."""
    parts = urlsplit(base_url)
    return parts.netloc or base_url


@dataclass
class _Label:
    text: str

    def label(self) -> str:
        return self.text


def _http():
    # lazy: the HTTP client loads only when a server is used
    import httpx

    return httpx


def _client(api_key: Optional[str], read_timeout: float = READ_TIMEOUT_S):
    httpx = _http()
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=read_timeout, write=30.0, pool=10.0)
    # trust_env=False: a proxy set for the internet must not carry a loopback or LAN model's traffic
    return httpx.Client(headers=headers, timeout=timeout, trust_env=False, follow_redirects=False)


def _server_message(response) -> str:
    """The error sentence a server sent (OpenAI's error object, FastAPI's detail, or the text)."""
    try:
        body = response.json()
    except Exception:
        text = (response.text or "").strip()
        return text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        if isinstance(err, str):
            return err[:300]
        if "detail" in body:
            return str(body["detail"])[:300]
        if "message" in body:
            return str(body["message"])[:300]
    return str(body)[:300]


def describe_status(base_url: str, status: int, message: str, model: Optional[str] = None) -> str:
    where = display_url(base_url)
    said = f": {message}" if message else ""
    if status in (401, 403):
        return (
            f"The server at {where} refused the API key ({status}{said}). "
            "Set the key it expects (Model → Connect to a server…, or --api-key-file)."
        )
    if status == 404:
        what = f"no model {model!r}" if model else "no such endpoint"
        return f"The server at {where} has {what} (404{said}). Check the model name and that the URL ends in /v1."
    if status == 429:
        return f"The server at {where} is busy (429{said}). Try again in a moment."
    if status >= 500:
        return f"The server at {where} failed ({status}{said})."
    return f"The server at {where} refused the request ({status}{said})."


def describe_transport(base_url: str, exc: BaseException, mid_stream: bool = False) -> str:
    httpx = _http()
    where = display_url(base_url)
    if isinstance(exc, httpx.ConnectError):
        return f"Could not reach the server at {where}: is it running, and is the address right?"
    if isinstance(exc, httpx.TimeoutException):
        kind = "to answer" if not mid_stream else "to send the next token"
        return f"The server at {where} took too long {kind} ({type(exc).__name__})."
    if mid_stream:
        return f"The connection to the server at {where} dropped mid-reply; the text so far is kept."
    return f"The connection to the server at {where} failed ({type(exc).__name__}: {exc})."


def list_models(base_url: str, api_key: Optional[str] = None, timeout: float = 10.0) -> list[dict]:
    """The server's models (``GET /models``): dicts with at least ``id``. Raises RemoteError."""
    httpx = _http()
    base_url = base_url.rstrip("/")
    with _client(api_key, timeout) as client:
        try:
            response = client.get(base_url + "/models")
        except httpx.HTTPError as exc:
            raise RemoteError(describe_transport(base_url, exc)) from None
    if response.status_code != 200:
        raise RemoteError(describe_status(base_url, response.status_code, _server_message(response)))
    try:
        data = response.json().get("data")
        models = [m for m in data if isinstance(m, dict) and m.get("id")]
    except Exception:
        raise RemoteError(
            f"The server at {display_url(base_url)} answered /models with something that is not a model list.",
            "Check that the URL is the server's OpenAI-compatible base (it usually ends in /v1).",
        ) from None
    return models


def _context_of(info: dict) -> Optional[int]:
    for key in ("max_model_len", "context_length", "max_context_length"):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return value
    meta = info.get("meta")
    if isinstance(meta, dict):
        value = meta.get("n_ctx_train") or meta.get("n_ctx")
        if isinstance(value, int) and value > 0:
            return value
    return None


REMOTE_CAPABILITIES = Capabilities(
    strategies=("remote",),  # the server decodes as it does
    token_ids=False,  # the server has the tokenizer: it takes chat messages
    draft=False,  # a server uses its own speculative decoding, if any
    measured_here=False,  # its memory and speed are the server's and the network's, not this machine's
    servable=False,  # Redline does not pass a server on behind its own API
    concurrency="threads",  # the server batches: several replies in flight, each on a thread
)


@dataclass
class RemoteModel(Backend):
    """A model on a server, standing where a LoadedModel stands (``engine.target``)."""

    base_url: str
    model_id: str
    api_key: Optional[str] = field(default=None, repr=False)  # never in a repr, a log or a traceback
    context_limit: int = DEFAULT_CONTEXT
    load_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    read_timeout: float = READ_TIMEOUT_S
    device: str = "remote"
    memory_bytes: int = 0  # the memory is the server's: nothing here to measure
    peak_memory_bytes: int = 0
    predicted_bytes: Optional[int] = None
    model: Any = None
    tokenizer: Any = None
    folder: Any = None
    source: Any = None
    fast_decoder: Any = None

    def __post_init__(self):
        self.precision = _Label("server")
        self._lock = threading.Lock()
        self._in_flight: dict[int, Any] = {}  # the replies in flight: id → their sink (a request handle)
        self._ended = threading.Event()

    @property
    def name(self) -> str:
        return f"{self.model_id} @ {display_url(self.base_url)}"

    @property
    def server(self) -> str:
        return display_url(self.base_url)

    @property
    def capabilities(self) -> Capabilities:
        return REMOTE_CAPABILITIES

    def reload_spec(self) -> tuple[str, Any, Optional[str]]:
        return f"{self.base_url}#{self.model_id}", None, self.api_key

    def answers_to(self, spec: str) -> bool:
        if not is_server_url(spec):
            return False
        try:
            base, model = parse_server_spec(spec)
        except RemoteError:
            return False
        return base == self.base_url and model in (None, self.model_id)

    def resolve_strategy(self, strategy: str) -> str:
        return "remote"  # whatever was asked: the server's own (the CLI says so once)

    def release(self) -> None:
        pass  # a client per request: nothing held between replies

    @property
    def where(self) -> str:
        return f"sent to {self.server}"

    # -- replies that run together: each a request in flight on a thread of its own (the server batches them) --
    def batchable(self, request) -> bool:
        return True

    def admit(self, request):
        if request.messages is None:
            raise UnsupportedConfiguration("A model on a server takes chat messages, not token ids.", "Send messages.")
        return None  # the server works out the prompt

    def add(self, sink, request, submitted: float, prepared) -> None:
        with self._lock:
            self._in_flight[id(sink)] = sink

        def run():
            try:
                sink.emit(Started(note=self.where))
                self.generate(request, sink, submitted)
            except Exception as exc:  # its failure is its own
                sink.fail(exc)
            finally:
                with self._lock:
                    self._in_flight.pop(id(sink), None)
                self._ended.set()

        threading.Thread(target=run, name=f"redline-remote-{getattr(sink, 'id', id(sink))}", daemon=True).start()

    def step(self) -> None:
        """Nothing to step here: wait a moment for one of the replies in flight to end."""
        self._ended.wait(STEP_WAIT_S)
        self._ended.clear()

    def running(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def cancel_running(self, note: str) -> None:
        with self._lock:
            sinks = list(self._in_flight.values())
        for sink in sinks:
            sink.cancel()

    def fail_running(self, error: BaseException) -> None:
        """A reply in flight ends on its own thread, which alone may finish its stream: each is stopped (it ends as
        cancelled, with what the server sent so far), not failed from here."""
        self.cancel_running(str(error))

    def generate(self, request, sink, submitted: Optional[float] = None) -> GenerationResult:
        if request.messages is None:
            raise UnsupportedConfiguration("A model on a server takes chat messages, not token ids.", "Send messages.")
        tools = getattr(request, "tools", None)
        result = self.chat(request.messages, request.sampling, sink.emit, lambda: sink.cancelled, tools=tools)
        sink.finish(result)
        return result

    # -- one reply --------------------------------------------------------------------------------------
    def chat(
        self,
        messages: Sequence[dict],
        sampling,
        on_event: Optional[Callable[[Any], None]] = None,
        should_cancel: Optional[Callable[[], bool]] = None,
        tools: Optional[Sequence[dict]] = None,
    ) -> GenerationResult:
        """Stream one reply; never raises for the server's failures (the result says what happened). ``tools``
        (OpenAI function tools) go to the server as they are; a reply that is calls comes back in
        ``result.tool_calls`` (OpenAI's shape), not as text."""
        body: dict = {
            "model": self.model_id,
            "messages": [_message(m, self.context_limit) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": int(sampling.max_new_tokens),
        }
        for key, value in (
            ("temperature", sampling.temperature),
            ("top_p", sampling.top_p),
            ("seed", sampling.seed),
        ):
            if value is not None:
                body[key] = value
        if sampling.stop:
            # OpenAI's API takes at most 4 stop strings (and refuses more), as do servers that follow it; the rest
            # are applied here, on the streamed text.
            body["stop"] = list(sampling.stop)[:SERVER_STOPS]
        if tools:
            body["tools"] = list(tools)
        extra = tuple(sampling.stop[SERVER_STOPS:])
        result = self._stream("/chat/completions", body, on_event, should_cancel, extra)
        if result.error and result.error.startswith(_CONTEXT_REFUSAL) and not result.text:
            # More new tokens than the server's context leaves after the prompt (which only the server can
            # count): ask again without a limit, so the server writes up to the end of its context.
            del body["max_tokens"]
            result = self._stream("/chat/completions", body, on_event, should_cancel, extra)
            result.notes.append(
                f"max new tokens ({sampling.max_new_tokens}) did not fit the server's context after the prompt; "
                "the server wrote up to the end of its context"
            )
        return result

    def _stream(self, path: str, body: dict, on_event, should_cancel, stops: tuple = ()) -> GenerationResult:
        """``stops``: stop strings the server was not given; the reply ends at the first of them here."""
        httpx = _http()
        result = GenerationResult(
            text="",
            token_ids=[],
            prompt_tokens=0,
            new_tokens=0,
            finish_reason="error",
            strategy="remote",
            precision="server",
            device="remote",
        )
        pieces: list[str] = []
        chunks: list[tuple[float, int]] = []
        usage: dict = {}
        timings: Optional[dict] = None
        server_finish: Optional[str] = None
        calls: dict[int, dict] = {}  # streamed tool calls by index, as their pieces arrive
        thought = _Thought()  # a reasoning model's thinking, as the server sends it apart from the answer
        cancelled = threading.Event()
        done = threading.Event()
        start = time.perf_counter()
        mid_stream = False
        local_stop = False  # the reply reached one of ``stops``
        tail_keep = max((len(x) for x in stops), default=1) - 1  # characters a stop string can begin before a piece
        tail = ""
        response_box: list = []

        def watch():  # closes the stream when the request is cancelled, even while the server is silent
            while not done.wait(0.02):
                if should_cancel is not None and should_cancel():
                    cancelled.set()
                    for r in response_box:
                        try:
                            r.close()
                        except Exception:
                            pass
                    return

        watcher = threading.Thread(target=watch, name="redline-remote-cancel", daemon=True)
        watcher.start()
        try:
            with _client(self.api_key, self.read_timeout) as client:
                with client.stream("POST", self.base_url + path, json=body) as response:
                    response_box.append(response)
                    if response.status_code != 200:
                        response.read()
                        message = _server_message(response)
                        if response.status_code == 400 and "max_tokens" in body and "context" in message.lower():
                            raise RemoteError(_CONTEXT_REFUSAL + message)
                        raise RemoteError(
                            describe_status(
                                self.base_url, response.status_code, _server_message(response), self.model_id
                            )
                        )
                    for line in response.iter_lines():
                        if cancelled.is_set():
                            break
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            continue
                        if isinstance(obj.get("error"), (dict, str)):
                            raise RemoteError(
                                f"The server at {self.server} stopped the reply: {_server_message_obj(obj)}"
                            )
                        if isinstance(obj.get("usage"), dict):
                            usage = obj["usage"]
                        if isinstance(obj.get("timings"), dict):
                            timings = obj["timings"]
                        for choice in obj.get("choices") or []:
                            delta = choice.get("delta") or {}
                            text = delta.get("content") if "delta" in choice else choice.get("text")
                            if choice.get("finish_reason"):
                                server_finish = choice["finish_reason"]
                            for piece in delta.get("tool_calls") or []:
                                _add_call_piece(calls, piece)
                            thinking = delta.get("reasoning_content") or delta.get("reasoning")
                            if isinstance(thinking, str) and thinking:
                                now = time.perf_counter() - start
                                chunks.append((now, 1))
                                thought.add(thinking, now)
                                if on_event is not None:
                                    on_event(TokenEvent(len(chunks) - 1, UNKNOWN_TOKEN, "", now, reasoning=thinking))
                            if text and stops:
                                # Only the last few characters received can begin a stop string: the reply so far is
                                # not joined again at every piece.
                                at = first_stop(tail + text, stops, len(tail))
                                if at is not None:
                                    text = text[: max(0, at - len(tail))]
                                    if at < len(tail):  # the stop string began in pieces already received
                                        full = "".join(pieces)
                                        pieces[:] = [full[: len(full) - (len(tail) - at)]]
                                    server_finish, local_stop = "stop", True
                                    cancelled.set()  # the rest of the reply is not wanted
                                else:
                                    tail = (tail + text)[-tail_keep:] if tail_keep else ""
                            if text:
                                mid_stream = True
                                now = time.perf_counter() - start
                                chunks.append((now, 1))
                                pieces.append(text)
                                if on_event is not None:
                                    on_event(TokenEvent(len(chunks) - 1, UNKNOWN_TOKEN, text, now))
            if local_stop:
                result.finish_reason = "stop"
            elif cancelled.is_set():
                result.finish_reason = "cancelled"
            else:
                result.finish_reason = {"stop": "stop", "length": "length"}.get(server_finish or "", "eos")
                if server_finish == "stop" and not body.get("stop"):
                    result.finish_reason = "eos"
        except RemoteError as exc:
            result.error = str(exc)
        except httpx.HTTPError as exc:
            if cancelled.is_set():
                result.finish_reason = "cancelled"
            else:
                result.error = describe_transport(self.base_url, exc, mid_stream)
        except Exception as exc:  # a reply must never raise into the scheduler
            if cancelled.is_set():
                result.finish_reason = "cancelled"
            else:
                result.error = f"The reply from the server at {self.server} could not be read ({type(exc).__name__})."
        finally:
            done.set()
        result.total_s = time.perf_counter() - start
        self._fill(result, "".join(pieces), chunks, usage, timings)
        thought.fill(result, usage, chunks)
        result.tool_calls = [calls[i] for i in sorted(calls) if calls[i]["function"]["name"]]
        if result.error and pieces:
            result.notes.append("The reply was cut short; the text that had arrived is kept.")
        return result

    def _fill(self, result: GenerationResult, text: str, chunks, usage: dict, timings: Optional[dict]) -> None:

        result.text = text
        fill_timing(result, chunks)
        counted = len(chunks)
        completion = usage.get("completion_tokens")
        result.new_tokens = int(completion) if isinstance(completion, int) else counted
        prompt = usage.get("prompt_tokens")
        result.prompt_tokens = int(prompt) if isinstance(prompt, int) else 0
        if isinstance(completion, int) and counted >= 2 and completion > 1:
            span = chunks[-1][0] - chunks[0][0]
            # decode tokens/s measured here: the tokens after the first over the time they took to arrive
            result.tokens_per_s = (completion - 1) / span if span > 0 else result.tokens_per_s
        result.server_timings = _server_figures(usage, timings)
        if timings:
            proposed = timings.get("draft_n")
            accepted = timings.get("draft_n_accepted")
            if isinstance(proposed, int) and proposed > 0:
                result.draft_proposed = proposed
                result.draft_accepted = accepted if isinstance(accepted, int) else None
                if result.draft_accepted is not None:
                    result.acceptance_rate = result.draft_accepted / proposed


class _Thought:
    """A remote reasoning model's thinking: the ``reasoning_content`` deltas (vLLM's, llama.cpp's, Redline's field;
    ``reasoning`` as others name it), kept apart from the answer and measured as a local reply's is."""

    def __init__(self):
        self.pieces: list[str] = []
        self.times: list[float] = []

    def add(self, text: str, now: float) -> None:
        self.pieces.append(text)
        self.times.append(now)

    def fill(self, result: GenerationResult, usage: dict, chunks) -> None:
        if not self.pieces:
            return
        result.reasoning = "".join(self.pieces)
        result.reasoning_format = "server"
        counted = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        result.reasoning_tokens = counted if isinstance(counted, int) else len(self.pieces)
        result.thinking_ms = self.times[-1] * 1000
        if len(self.times) > 1 and self.times[-1] > self.times[0]:
            result.thinking_tokens_per_s = (len(self.times) - 1) / (self.times[-1] - self.times[0])
        thinking = set(self.times)
        answer = [t for t, _ in chunks if t not in thinking]
        if answer:
            result.ttfat_ms = answer[0] * 1000
        if len(answer) > 1 and answer[-1] > answer[0]:
            result.answer_tokens_per_s = (len(answer) - 1) / (answer[-1] - answer[0])


def first_stop(text: str, stops: Sequence[str], new_from: int) -> Optional[int]:
    """Where the first of ``stops`` starts in ``text``, counting only those that end after ``new_from`` (the text
    before it was checked already); None if none is there."""
    found = []
    for stop in stops:
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at >= 0:
            found.append(at)
    return min(found) if found else None


def _message(m: dict, context: Optional[int] = None) -> dict:
    """A message as the server takes it: its role and content, and a past call's ``tool_calls`` / the
    ``tool_call_id`` a tool's result answers."""
    out = {"role": m["role"], "content": wire.content(m, context) if m.get("attachments") else m["content"]}
    for key in ("tool_calls", "tool_call_id", "name"):
        if m.get(key):
            out[key] = m[key]
    return out


def _add_call_piece(calls: dict[int, dict], piece: dict) -> None:
    """One ``delta.tool_calls`` entry: the first of a call brings its id and name, the rest its arguments."""
    if not isinstance(piece, dict):
        return
    index = piece.get("index", len(calls))
    call = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if piece.get("id"):
        call["id"] = piece["id"]
    fn = piece.get("function") or {}
    if fn.get("name"):
        call["function"]["name"] = fn["name"]
    if isinstance(fn.get("arguments"), str):
        call["function"]["arguments"] += fn["arguments"]


def _server_message_obj(obj: dict) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


def _server_figures(usage: dict, timings: Optional[dict]) -> Optional[dict]:
    """What the server itself reported: usage, and llama.cpp-style timings where given."""
    figures: dict = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if isinstance(usage.get(key), int):
            figures[key] = usage[key]
    if timings:
        for key in (
            "prompt_n",
            "prompt_ms",
            "prompt_per_second",
            "predicted_n",
            "predicted_ms",
            "predicted_per_second",
            "ttft_ms",
            "draft_n",
            "draft_n_accepted",
        ):
            if isinstance(timings.get(key), (int, float)):
                figures[key] = timings[key]
    return figures or None


def connect(spec: str, api_key: Optional[str] = None, read_timeout: float = READ_TIMEOUT_S) -> RemoteModel:
    """Check the server at ``spec`` (``URL[#MODEL]``) and return its model. Raises RemoteError."""
    started = time.perf_counter()
    base_url, wanted = parse_server_spec(spec)
    models = list_models(base_url, api_key)
    if not models:
        raise RemoteError(f"The server at {display_url(base_url)} lists no models.", "Load a model on the server.")
    ids = [m["id"] for m in models]
    if wanted is None:
        info = models[0]
    else:
        info = next((m for m in models if m["id"] == wanted), None)
        if info is None:
            shown = ", ".join(ids[:8]) + (" …" if len(ids) > 8 else "")
            raise RemoteError(
                f"The server at {display_url(base_url)} has no model {wanted!r}; it offers: {shown}.",
                "Pick one of those (URL#MODEL).",
            )
    remote = RemoteModel(base_url, info["id"], api_key, _context_of(info) or DEFAULT_CONTEXT, read_timeout=read_timeout)
    remote.load_seconds = time.perf_counter() - started
    if wanted is None and len(ids) > 1:
        remote.notes.append(f"The server offers {len(ids)} models; using {info['id']} (add #MODEL to choose).")
    if _context_of(info) is None:
        remote.notes.append(f"The server does not say its context length; assuming {DEFAULT_CONTEXT} tokens.")
    return remote
