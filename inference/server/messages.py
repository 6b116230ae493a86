"""Anthropic's Messages API (``POST /v1/messages``), which agent CLIs speak, over the same engine as chat completions.

A request's ``system`` and ``messages`` (content as a string or blocks: ``text``, ``image`` and ``document`` with a
base64 source, ``tool_use`` in the assistant's turns, ``tool_result`` in the user's) become chat messages, its
``tools`` (``name``, ``description``, ``input_schema``) chat tools and ``tool_choice`` (auto, any, tool, none) chat's,
``stop_sequences`` stops; the one chat preparation runs them. The answer is a ``message`` (content blocks: a reasoning
model's ``thinking``, ``text``, ``tool_use``; ``stop_reason`` ``end_turn``, ``max_tokens``, ``stop_sequence`` or
``tool_use``; ``usage``), or with ``stream: true`` its events in Anthropic's order: ``message_start``, per block
``content_block_start``, ``content_block_delta``… (``text_delta``, ``thinking_delta``, ``input_json_delta``),
``content_block_stop``, then ``message_delta`` (the stop reason, the output tokens) and ``message_stop``. Errors are
Anthropic's shape: ``{"type": "error", "error": {"type": "invalid_request_error", "message": …}}``."""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..decoding.tool_calls import CallStream, argument_pieces, parse
from ..events import Failed, FinishedEvent, TokenEvent
from .protocol import ChatCompletionRequest, FieldError
from .streaming import Closing, ended_early, failure

STRICT = ConfigDict(extra="forbid", strict=True)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
ERROR_TYPES.update({413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"})


class ToolA(BaseModel):
    model_config = ConfigDict(extra="allow")  # a client's own keys (cache_control, type) pass unread
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: Optional[str] = None
    input_schema: dict[str, Any]


class MessagesRequest(BaseModel):
    model_config = STRICT
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    tools: Optional[list[ToolA]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None  # {"type": "enabled" | "disabled"}: a reasoning model's switch
    # {"effort": low…max, "format": {"type": "json_schema", "schema": …}}: the effort as a reasoning model's, the
    # format as chat's response_format (a grammar while decoding)
    output_config: Optional[dict[str, Any]] = None
    # Accepted and ignored: what a hosted service means by them has no counterpart on one machine (a user id, a
    # service tier or speed, a region, prompt caching hints: the prefix cache keeps every prompt's pages anyway).
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    speed: Optional[str] = None
    inference_geo: Optional[str] = None
    cache_control: Optional[dict[str, Any]] = None
    diagnostics: Optional[Any] = None
    user_profile_id: Optional[str] = None
    workspace_id: Optional[str] = None
    container: Optional[Any] = None

    def unsupported(self) -> None:
        """What the server refuses beyond the fields' own checks: nothing here (read by ``Preparation.read``)."""
        return None


def _text_of(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise FieldError(where, f"'{where}' must be a string or a list of text blocks.")
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise FieldError(f"{where}[{j}]", f"'{where}[{j}]' must be a text block here.")
        out.append(b["text"])
    return "".join(out)


def _media(block: dict, where: str) -> dict:
    """An ``image`` or ``document`` block as chat's part (a data URL read by parts.read_content, as chat's are)."""
    source = block.get("source") or {}
    kind = source.get("type")
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": str(source.get("url", ""))}}  # refused there, named
    if kind == "text" and block["type"] == "document":
        return {"type": "text", "text": str(source.get("data", ""))}
    if kind != "base64":
        raise FieldError(f"{where}.source", f"'{where}.source' must be a base64 source (or text, for a document).")
    url = f"data:{source.get('media_type', 'application/octet-stream')};base64,{source.get('data', '')}"
    if block["type"] == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"file_data": url, "filename": str(block.get("title") or "document")}}


def _turn(m: Any, where: str) -> list[dict]:
    """One Messages turn as chat messages: tool results become tool messages, tool uses the assistant's calls."""
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise FieldError(f"{where}.role", f"'{where}.role' must be user or assistant.")
    role, content = m["role"], m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise FieldError(f"{where}.content", f"'{where}.content' must be a string or a list of content blocks.")
    parts: list[dict] = []
    calls: list[dict] = []
    results: list[dict] = []
    for j, b in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind in ("image", "document") and role == "user":
            parts.append(_media(b, at))
        elif kind == "tool_use" and role == "assistant":
            args = json.dumps(b.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": str(b.get("id")), "type": "function", "function": {"name": b.get("name"), "arguments": args}}
            )
        elif kind == "tool_result" and role == "user":
            body = b.get("content", "")
            text = body if isinstance(body, str) else _text_of(body, f"{at}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id")), "content": text})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # an earlier reply's thinking: not sent back to the model (templates drop it too)
        else:
            raise FieldError(at, f"'{at}' is a {kind!r} block, which a {role} turn here does not carry.")
    out = results[:]
    if parts or calls or not results:
        simple = all(p["type"] == "text" for p in parts)
        text_or_parts: Any = "".join(p["text"] for p in parts) if simple else parts
        message: dict = {"role": role, "content": text_or_parts if (parts or not calls) else None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def chat_request(body: MessagesRequest) -> ChatCompletionRequest:
    """The Messages request as a chat completions request (validated as one)."""
    messages: list[dict] = []
    if body.system:
        messages.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, m in enumerate(body.messages):
        messages.extend(_turn(m, f"messages[{i}]"))
    data: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": body.max_tokens}
    for key in ("temperature", "top_p", "top_k"):
        if getattr(body, key) is not None:
            data[key] = getattr(body, key)
    if body.stop_sequences:
        data["stop"] = body.stop_sequences
    if body.tools:
        data["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
            }
            for t in body.tools
        ]
    choice = body.tool_choice or {}
    kind = choice.get("type")
    if kind == "any":
        data["tool_choice"] = "required"
    elif kind == "tool":
        data["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in ("auto", "none"):
        data["tool_choice"] = kind
    elif choice:
        raise FieldError("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none.")
    if choice.get("disable_parallel_tool_use"):
        data["parallel_tool_calls"] = False
    if body.thinking is not None:
        data["reasoning_effort"] = "none" if body.thinking.get("type") == "disabled" else "medium"
    output = body.output_config or {}
    effort = output.get("effort")
    if effort:
        data["reasoning_effort"] = {"xhigh": "high", "max": "high"}.get(effort, effort)
    fmt = output.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        data["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.get("schema")},
        }
    elif fmt:
        raise FieldError("output_config.format", '\'output_config.format\' must be {"type": "json_schema", …}.')
    return ChatCompletionRequest.model_validate(data)


# -- the answer ---------------------------------------------------------------------------------------------------
def _stop(result, body: MessagesRequest, calls) -> tuple[str, Optional[str]]:
    if calls:
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.finish_reason == "stop":
        stops = body.stop_sequences or []
        return "stop_sequence", stops[0] if len(stops) == 1 else None  # which one matched is not kept
    return "end_turn", None


def _usage(result, output_tokens: Optional[int] = None) -> dict:
    return {
        "input_tokens": result.prompt_tokens,
        "output_tokens": result.new_tokens if output_tokens is None else output_tokens,
        "cache_read_input_tokens": result.cached_tokens or 0,
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call) -> dict:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name, "input": args}


def _message(ident: str, name: str, content: list, stop=(None, None), usage=None) -> dict:
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": name,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage or {"input_tokens": 0, "output_tokens": 0},
    }


def whole(body: MessagesRequest, name: str, result, tools) -> dict:
    text, calls = (result.text, [])
    if tools is not None:
        text, calls = parse(tools.family, result.text, tools.names, cut=result.finish_reason == "length")
    content: list = []
    if result.reasoning:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if text or not calls:
        content.append({"type": "text", "text": text})
    content.extend(_tool_use(c) for c in calls)
    return _message("msg_" + uuid.uuid4().hex[:24], name, content, _stop(result, body, calls), _usage(result))


def _event(kind: str, **fields) -> dict:
    return {"event": kind, "data": json.dumps({"type": kind, **fields}, ensure_ascii=False)}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


async def events(api, handle, queue, body: MessagesRequest, name: str, tools):
    """The streamed message, in Anthropic's order."""
    held = CallStream(tools.family, tools.names, tools.forced) if tools is not None else None
    ident = "msg_" + uuid.uuid4().hex[:24]
    yield _event("message_start", message=_message(ident, name, []))
    index = -1
    open_kind: Optional[str] = None  # the block being streamed: "thinking" or "text"

    def switch(kind: str):
        nonlocal index, open_kind
        out = []
        if open_kind is not None:
            out.append(_event("content_block_stop", index=index))
        index += 1
        open_kind = kind
        block = (
            {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
        )
        out.append(_event("content_block_start", index=index, content_block=block))
        return out

    def delta(kind: str, piece: str):
        out = switch(kind) if open_kind != kind else []
        field = (
            {"type": "text_delta", "text": piece} if kind == "text" else {"type": "thinking_delta", "thinking": piece}
        )
        out.append(_event("content_block_delta", index=index, delta=field))
        return out

    try:
        result = None
        while True:
            event = await queue.get()
            if isinstance(event, TokenEvent):
                if event.token_id >= 0:
                    api.stats.token()
                for e in delta("thinking", event.reasoning) if event.reasoning else []:
                    yield e
                piece = held.feed(event.text) if held is not None and event.text else event.text
                for e in delta("text", piece) if piece else []:
                    yield e
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, (Failed, Closing)):
                yield _event("error", error={"type": "api_error", "message": ended_early(event, handle)})
                return
        if result.finish_reason in ("error", "cancelled"):
            yield _event("error", error={"type": "api_error", "message": failure(result)[1]})
            return
        calls = []
        if held is not None:
            rest, calls = held.finish(cut=result.finish_reason == "length")
            for e in delta("text", rest) if rest else []:
                yield e
        if open_kind is not None:
            yield _event("content_block_stop", index=index)
        for call in calls:
            index += 1
            block = {**_tool_use(call), "input": {}}
            yield _event("content_block_start", index=index, content_block=block)
            for piece in argument_pieces(call.arguments or "{}"):
                yield _event(
                    "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece}
                )
            yield _event("content_block_stop", index=index)
        stop = _stop(result, body, calls)
        yield _event(
            "message_delta",
            delta={"stop_reason": stop[0], "stop_sequence": stop[1]},
            usage={"output_tokens": result.new_tokens},
        )
        yield _event("message_stop")
    finally:
        handle.cancel()
        api.untrack(handle)
