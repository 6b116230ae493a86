"""The answers: a streamed reply as server-sent events (OpenAI's chunks, then ``[DONE]``), a whole one as one JSON
object, each with the exact ``usage`` and llama.cpp-style ``timings``; a generation that ended without its answer as
an error object. A client that goes away cancels its generation."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Optional

from redline.inference.decoding.tool_calls import CallStream, argument_pieces, parse
from redline.inference.events import Failed, FinishedEvent, GenerationResult, TokenEvent
from redline.inference.server.protocol import error_body

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "error": "error"}


@dataclass
class Closing:
    """Put in a reply's event queue when the server stops: the reply ends now, with a 503 saying ``reason``."""

    reason: str


def closing_message(reason: str) -> str:
    return f"The reply was stopped before its end: {reason}. Send the request again once the server is back."


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
        "cache_n": result.cached_tokens or 0,  # of the prompt's tokens, those taken from the prefix cache
    }


def usage(result: GenerationResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens or 0},
    }


def failure(result: GenerationResult) -> tuple[int, str]:
    """A generation that ended without its answer, its client still there: it failed (500), or the engine
    stopped it for something else (503: a model load in the window, Redline closing)."""
    if result.finish_reason == "cancelled":
        why = next((n for n in reversed(result.notes) if n.startswith("Stopped")), "Stopped by Redline.")
        return 503, f"The reply was stopped before its end: {why} Send the request again."
    return 500, f"The generation failed: {result.error}"


def _chunk(
    ident, created, name, chat: bool, text: Optional[str], finish: Optional[str], first=False, calls=None
) -> dict:
    if chat:
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if calls is not None:
            delta["tool_calls"] = calls
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    return {"id": ident, "object": kind, "created": created, "model": name, "choices": [choice]}


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def _call_chunks(ident, created, name, calls) -> list[dict]:
    """OpenAI's streamed calls: per call, its index, id and name first, then its arguments in pieces."""
    out = []
    for index, call in enumerate(calls):
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        out.append(_chunk(ident, created, name, True, None, None, calls=[head]))
        for piece in argument_pieces(call.arguments):
            out.append(
                _chunk(
                    ident, created, name, True, None, None, calls=[{"index": index, "function": {"arguments": piece}}]
                )
            )
    return out


async def stream(api, handle, queue, ident, created, name, chat, include_usage, tools=None):
    stats = api.stats
    result: Optional[GenerationResult] = None
    calls: list = []
    held = CallStream(tools.family, tools.names, tools.forced) if tools is not None else None
    try:
        if chat:
            yield _data(_chunk(ident, created, name, chat, "", None, first=True))
        while True:
            event = await queue.get()
            if isinstance(event, TokenEvent):
                if event.token_id >= 0:
                    stats.token()
                text = held.feed(event.text) if held is not None and event.text else event.text
                if text:
                    yield _data(_chunk(ident, created, name, chat, text, None))
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, Failed):
                yield _data(error_body(500, f"The generation failed: {event.message}"))
                yield {"data": "[DONE]"}
                return
            elif isinstance(event, Closing):
                handle.cancel()
                yield _data(error_body(503, closing_message(event.reason), code="server_stopped"))
                yield {"data": "[DONE]"}
                return
        if result.finish_reason in ("error", "cancelled"):
            yield _data(error_body(*failure(result)))
            yield {"data": "[DONE]"}
            return
        finish = FINISH[result.finish_reason]
        if held is not None:
            rest, calls = held.finish()
            if rest:
                yield _data(_chunk(ident, created, name, chat, rest, None))
            for chunk in _call_chunks(ident, created, name, calls):
                yield _data(chunk)
            if calls:
                finish = "tool_calls"
        last = _chunk(ident, created, name, chat, None if chat else "", finish)
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
        api.untrack(handle)


async def collect(api, handle, queue, request):
    """The finished generation's result, or the error response (JSON) to answer instead."""
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
    if not chat:
        return {"index": index, "text": result.text, "logprobs": None, "finish_reason": finish}
    message: dict = {"role": "assistant", "content": result.text}
    if tools is not None:
        content, calls = parse(tools.family, result.text, tools.names)
        if calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": [c.as_openai() for c in calls]}
            finish = "tool_calls"
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}


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
    total = usage(first)
    written = sum(r.new_tokens for r in results)
    total.update(completion_tokens=written, total_tokens=first.prompt_tokens + written)
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": name,
        "choices": [choice_of(r, i, chat, tools) for i, r in enumerate(results)],
        "usage": total,
        "timings": timings(first),
    }
