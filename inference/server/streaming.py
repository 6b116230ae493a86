"""The answers: a streamed reply as server-sent events (OpenAI's chunks, then ``[DONE]``), a whole one as one JSON
object, each with the exact ``usage`` and llama.cpp-style ``timings``; a generation that ended without its answer as
an error object. A client that goes away cancels its generation."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Optional

from ..decoding.tool_calls import CallStream, argument_pieces, parse
from ..events import Failed, FinishedEvent, GenerationResult, TokenEvent, TokenLogprob
from .protocol import error_body

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "error": "error"}


@dataclass
class Closing:
    """Put in a reply's event queue when the server stops: the reply ends now, with a 503 saying ``reason``."""

    reason: str


def closing_message(reason: str) -> str:
    return f"The reply was stopped before its end: {reason}. Send the request again once the server is back."


def ended_early(event, handle) -> str:
    """Why a stream ends before its reply (a Failed generation, or Closing: the server stops, so the reply is
    cancelled), in the sentence a client's error event carries."""
    if isinstance(event, Closing):
        handle.cancel()
        return closing_message(event.reason)
    return f"The generation failed: {event.message}"


def timings(result: GenerationResult) -> dict:
    """llama.cpp's ``timings`` object from Redline's measurements, plus TTFT and the time spent queued.

    prompt_ms: from the start of work on the request to its first token (prefill; the queue excluded: the result's
    own TTFT); ttft_ms: from the request's arrival at the engine to its first token (the queue included, as this
    object has always said: ``queued_ms`` plus ``prompt_ms``); predicted_*: the decode, tokens after the first over
    their time (Redline's decode tokens/s)."""
    queued = result.queued_ms or 0.0
    prompt_ms = result.ttft_ms or 0.0
    ttft = result.submitted_ttft_ms or 0.0
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
        "cache_n": result.cached_tokens or 0,  # of the prompt's tokens, those taken from the prefix cache
    }


def usage(result: GenerationResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens or 0},
        # of the completion's tokens, a reasoning model's thinking (OpenAI's field; 0 for a model that does not reason)
        "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
    }


def failure(result: GenerationResult) -> tuple[int, str]:
    """A generation that ended without its answer, its client still there: it failed (500), or the engine
    stopped it for something else (503: a model load in the window, Redline closing)."""
    if result.finish_reason == "cancelled":
        why = next((n for n in reversed(result.notes) if n.startswith("Stopped")), "Stopped by Redline.")
        return 503, f"The reply was stopped before its end: {why} Send the request again."
    return 500, f"The generation failed: {result.error}"


def total_usage(results: list[GenerationResult]) -> dict:
    """``usage`` of one or more choices of one prompt: the prompt once, every choice's tokens."""
    first = results[0]
    total = usage(first)
    written = sum(r.new_tokens for r in results)
    total.update(completion_tokens=written, total_tokens=first.prompt_tokens + written)
    total["completion_tokens_details"] = {"reasoning_tokens": sum(r.reasoning_tokens for r in results)}
    return total


# -- log-probabilities (decoding/logprobs.py computes them; TokenLogprob in events.py) -------------------------
FLOOR = -9999.0  # what OpenAI writes for a probability of zero: JSON has no -Infinity


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR  # also NaN (a comparison with NaN is false)


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """Chat's ``logprobs``: ``content``, per token its text, log-probability, UTF-8 bytes and ``top_logprobs``."""

    def item(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    content = [{**item(e.text, e.logprob), "top_logprobs": [item(text, lp) for _, text, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict:
    """The legacy completions' ``logprobs``: parallel lists; ``top_logprobs`` per token the ``logprobs`` best and the
    chosen token (OpenAI's "up to logprobs + 1"); ``text_offset`` each token's start in the reply's text, from
    ``offset`` (what the stream's earlier chunks wrote)."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        top = {text: _finite(lp) for _, text, lp in e.top}
        top.setdefault(e.text, _finite(e.logprob))
        out["tokens"].append(e.text)
        out["token_logprobs"].append(_finite(e.logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(e.text)
    return out


def _chunk(
    ident,
    created,
    name,
    chat: bool,
    text: Optional[str],
    finish: Optional[str],
    first=False,
    calls=None,
    index: int = 0,
    logprobs: Optional[dict] = None,
    reasoning: Optional[str] = None,
) -> dict:
    if chat:
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if reasoning is not None:  # a reasoning model's thinking, apart from the answer (vLLM's and llama.cpp's field)
            delta["reasoning_content"] = reasoning
        if text is not None:
            delta["content"] = text
        if calls is not None:
            delta["tool_calls"] = calls
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        kind = "text_completion"
    return {"id": ident, "object": kind, "created": created, "model": name, "choices": [choice]}


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def _call_chunks(ident, created, name, calls, choice: int = 0) -> list[dict]:
    """OpenAI's streamed calls: per call, its index, id and name first, then its arguments in pieces."""
    out = []
    for index, call in enumerate(calls):
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        out.append(_chunk(ident, created, name, True, None, None, calls=[head], index=choice))
        for piece in argument_pieces(call.arguments):
            arguments = [{"index": index, "function": {"arguments": piece}}]
            out.append(_chunk(ident, created, name, True, None, None, calls=arguments, index=choice))
    return out


class _Choice:
    """One choice of a stream: its held tool-call text, the log-probability entries its next chunk carries, and how
    much text its earlier chunks wrote (the completions' ``text_offset``)."""

    def __init__(self, tools):
        self.held = CallStream(tools.family, tools.names, tools.forced) if tools is not None else None
        self.pending: list[TokenLogprob] = []
        self.written = 0
        self.result: Optional[GenerationResult] = None

    def logprobs(self, chat: bool) -> Optional[dict]:
        """The pending entries, formatted for the chunk that carries them (None when there are none)."""
        if not self.pending:
            return None
        entries, self.pending = self.pending, []
        if chat:
            return chat_logprobs(entries)
        out = completion_logprobs(entries, self.written)
        self.written += sum(len(e.text) for e in entries)
        return out


async def _events(runs):
    """(choice, event) from the runs' queues as they come; one run's queue is read as it is."""
    if len(runs) == 1:
        queue = runs[0][1]
        while True:
            yield 0, await queue.get()
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i, queue):
        while True:
            event = await queue.get()
            merged.put_nowait((i, event))
            if isinstance(event, (FinishedEvent, Failed, Closing)):
                return

    pumps = [asyncio.ensure_future(pump(i, queue)) for i, (_, queue) in enumerate(runs)]
    try:
        while True:
            yield await merged.get()
    finally:
        for task in pumps:
            task.cancel()


async def stream(api, runs, ident, created, name, chat, include_usage, tools=None):
    """The streamed answer of one or more generations (``n`` choices, each ``(handle, queue)`` in ``runs``, decoded
    together): their chunks interleaved as their tokens come, each with its choice's ``index``; each choice ends with
    its own ``finish_reason`` chunk; the usage chunk (``include_usage``) comes once, after the last."""
    stats = api.stats
    choices = [_Choice(tools) for _ in runs]
    left = len(runs)
    events = _events(runs)
    try:
        if chat:
            for i in range(len(runs)):
                yield _data(_chunk(ident, created, name, chat, "", None, first=True, index=i))
        while left:
            i, event = await events.__anext__()
            choice = choices[i]
            if isinstance(event, TokenEvent):
                if event.token_id >= 0:
                    stats.token()
                if event.logprobs:
                    choice.pending.extend(event.logprobs)
                if event.reasoning and chat:
                    yield _data(_chunk(ident, created, name, chat, None, None, index=i, reasoning=event.reasoning))
                text = choice.held.feed(event.text) if choice.held is not None and event.text else event.text
                if text:
                    yield _data(_chunk(ident, created, name, chat, text, None, index=i, logprobs=choice.logprobs(chat)))
                continue
            if isinstance(event, Failed):
                yield _data(error_body(500, f"The generation failed: {event.message}"))
                yield {"data": "[DONE]"}
                return
            if isinstance(event, Closing):
                yield _data(error_body(503, closing_message(event.reason), code="server_stopped"))
                yield {"data": "[DONE]"}
                return
            if not isinstance(event, FinishedEvent):
                continue
            result = choice.result = event.result
            left -= 1
            if result.finish_reason in ("error", "cancelled"):
                yield _data(error_body(*failure(result)))
                yield {"data": "[DONE]"}
                return
            finish = FINISH[result.finish_reason]
            if choice.held is not None:
                rest, calls = choice.held.finish(cut=result.finish_reason == "length")
                if rest:
                    yield _data(_chunk(ident, created, name, chat, rest, None, index=i, logprobs=choice.logprobs(chat)))
                for chunk in _call_chunks(ident, created, name, calls, i):
                    yield _data(chunk)
                if calls:
                    finish = "tool_calls"
            scored = choice.logprobs(chat)  # the tokens no text chunk carried (an end-of-sequence token's, say)
            last = _chunk(ident, created, name, chat, None if chat else "", finish, index=i, logprobs=scored)
            if not include_usage:
                last["timings"] = timings(result)
            yield _data(last)
        if include_usage:
            results = [c.result for c in choices]
            tail = {
                "id": ident,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": name,
                "choices": [],
                "usage": total_usage(results),
                "timings": timings(results[0]),
            }
            yield _data(tail)
        yield {"data": "[DONE]"}
    finally:
        # The client went away (this task is cancelled) or the stream ended: this request's generations (all its
        # choices) stop, at the engine's next decode step (a no-op for those that have finished).
        await events.aclose()
        for handle, _ in runs:
            handle.cancel()
            api.untrack(handle)


async def collect(api, handle, queue, request):
    """The finished generation's result, or the error response (JSON) to answer instead."""
    # lazy: the server's libraries load only when it starts
    from fastapi.responses import JSONResponse

    stats = api.stats

    async def gone():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(gone())
    result, failed, closing = None, None, None
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
                stats.token()
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, Failed):
                failed = event.message
                break
            elif isinstance(event, Closing):
                closing = event.reason
                break
    finally:
        watcher.cancel()
        if result is None:
            handle.cancel()
        api.untrack(handle)
    if closing is not None:
        return JSONResponse(error_body(503, closing_message(closing), code="server_stopped"), 503)
    if failed is not None:
        return JSONResponse(error_body(500, f"The generation failed: {failed}"), 500)
    if result.finish_reason in ("error", "cancelled"):
        status, message = failure(result)
        return JSONResponse(error_body(status, message), status)
    return result


def choice_of(result: GenerationResult, index: int, chat: bool, tools=None) -> dict:
    finish = FINISH[result.finish_reason]
    scored = result.logprobs
    if not chat:
        logprobs = completion_logprobs(scored) if scored is not None else None
        return {"index": index, "text": result.text, "logprobs": logprobs, "finish_reason": finish}
    message: dict = {"role": "assistant", "content": result.text}
    thinking = {"reasoning_content": result.reasoning or None} if result.reasoning_format else {}
    message.update(thinking)
    if tools is not None:
        # Cut by max_tokens in the middle of a call: the complete calls before it are the answer.
        content, calls = parse(tools.family, result.text, tools.names, cut=result.finish_reason == "length")
        if calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": [c.as_openai() for c in calls]}
            message.update(thinking)
            finish = "tool_calls"
    logprobs = chat_logprobs(scored) if scored is not None else None
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}


async def whole(api, runs, request, ident, created, name, chat, tools=None):
    """The whole answer of one or more generations (``n`` choices), each ``(handle, queue)`` in ``runs``, decoded
    together; ``usage`` counts the prompt once and every choice's tokens."""
    results = await asyncio.gather(*(collect(api, handle, queue, request) for handle, queue in runs))
    for result in results:
        if not isinstance(result, GenerationResult):
            for handle, _ in runs:
                handle.cancel()
            return result
    first = results[0]
    total = total_usage(results)
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": name,
        "choices": [choice_of(r, i, chat, tools) for i, r in enumerate(results)],
        "usage": total,
        "timings": timings(first),
    }
