"""OpenAI's Responses API (``POST /v1/responses``) over the same engine as chat completions: a request's ``input``
(a string, or items: messages, ``function_call`` and ``function_call_output``) and ``instructions`` become chat
messages, its function tools chat tools, ``text.format`` a response_format, and the one chat preparation runs them
(the prompt through the model's template, the grammars, the context check). The answer is a ``response`` object, or
with ``stream: true`` its typed events in OpenAI's order: ``response.created``, ``response.in_progress``, per output
item ``response.output_item.added`` … ``response.output_item.done`` (text: ``response.content_part.added``,
``response.output_text.delta``…, ``response.output_text.done``, ``response.content_part.done``; a call:
``response.function_call_arguments.delta``…, ``response.function_call_arguments.done``), then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it).

No response is stored (``store`` is taken as false): ``previous_response_id`` is refused with a 400 saying to send the
whole conversation as ``input`` items, which is what agent SDKs do with ``store: false``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..decoding.tool_calls import CallStream, argument_pieces, parse
from ..events import Failed, FinishedEvent, TokenEvent
from .parts import data_url
from .protocol import ATTACHED_PARTS, MEDIA_PARTS, TEXT_ONLY, ChatCompletionRequest, FieldError
from .streaming import Closing, ended_early, failure

LOOSE = ConfigDict(extra="forbid", strict=True)


class FunctionToolR(BaseModel):
    model_config = LOOSE
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class TextFormat(BaseModel):
    model_config = LOOSE
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


class TextOptions(BaseModel):
    model_config = LOOSE
    format: Optional[TextFormat] = None
    verbosity: Optional[str] = None


class ResponsesRequest(BaseModel):
    model_config = LOOSE
    model: str = Field(min_length=1)
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    text: Optional[TextOptions] = None
    stream: bool = False
    store: Optional[bool] = None  # taken as false: nothing is kept
    previous_response_id: Optional[str] = None
    # accepted and ignored: they change nothing on a local server
    metadata: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    include: Optional[list[str]] = None
    truncation: Optional[Literal["disabled", "auto"]] = None
    reasoning: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    safety_identifier: Optional[str] = None
    stream_options: Optional[dict[str, Any]] = None
    seed: Optional[int] = Field(default=None, ge=0, le=2**63 - 1)  # not OpenAI's; as in chat completions

    def unsupported(self) -> Optional[tuple[str, str]]:
        if self.previous_response_id:
            return "previous_response_id", (
                "previous_response_id is not supported: Redline's server keeps no responses (store: false). Send the "
                "whole conversation as input items instead."
            )
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                return f"tools[{i}]", (
                    f"'tools[{i}]' is a {tool.get('type')!r} tool; Redline's server runs function tools only."
                )
        return None

    def chat(self) -> dict:
        """The same request as a chat completions body (validated there, strictly)."""
        messages: list[dict] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        for i, item in enumerate(items):
            messages.extend(_item(item, f"input[{i}]", messages))
        body: dict = {"model": self.model, "messages": messages, "stream": False}
        if self.tools:
            tools = [FunctionToolR.model_validate(t) for t in self.tools]
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        k: v
                        for k, v in {"name": t.name, "description": t.description, "parameters": t.parameters}.items()
                        if v is not None
                    },
                }
                for t in tools
            ]
        choice = self.tool_choice
        if isinstance(choice, dict):
            if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
                raise FieldError("tool_choice", 'tool_choice names a function as {"type": "function", "name": "…"}.')
            choice = {"type": "function", "function": {"name": choice["name"]}}
        for key, value in (
            ("tool_choice", choice),
            ("parallel_tool_calls", self.parallel_tool_calls),
            ("max_completion_tokens", self.max_output_tokens),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("seed", self.seed),
        ):
            if value is not None:
                body[key] = value
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:  # a reasoning model's effort, checked as chat's reasoning_effort is
            body["reasoning_effort"] = effort
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise FieldError("text.format", "text.format json_schema needs a 'schema' object.")
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": fmt.name or "output", "schema": fmt.schema_},
            }
        elif fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(f"{where}.content", f"'{where}.content' must be a string or a list of content parts.")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            why = "only user messages carry images and files" if kind in ATTACHED_PARTS else TEXT_ONLY
            raise FieldError(f"{where}.content[{j}]", f"'{where}.content[{j}]' is an {kind} part; {why}.")
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise FieldError(
                f"{where}.content[{j}]",
                f'\'{where}.content[{j}]\' is not a text part; send {{"type": "input_text", "text": "…"}}.',
            )
        out.append(part["text"])
    return "".join(out)


def _attached(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in ATTACHED_PARTS


def _chat_part(part: Any, where: str) -> dict:
    """A user message's part in chat's shape: text as a text part, an image or a file as chat's own part (read,
    or refused with its field, by ``parts.read_content`` as a chat request's are)."""
    kind = part.get("type") if isinstance(part, dict) else None
    # The data URL is checked here too, so a refusal (a FieldError) names the Responses API's own field.
    if kind == "input_image" and not part.get("file_id"):
        url = part.get("image_url")
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):  # fetched (or refused) later
            data_url(url, f"{where}.image_url")
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_file":
        if not part.get("file_id") and not part.get("file_url"):
            data_url(part.get("file_data"), f"{where}.file_data")
        inner = {k: part[k] for k in ("file_data", "filename", "file_id", "file_url") if k in part}
        return {"type": "file", "file": inner}
    if _attached(part):
        return part
    return {"type": "text", "text": _text([part], where.rsplit(".content", 1)[0])}


def _item(item: Any, where: str, so_far: list[dict]) -> list[dict]:
    """One input item as chat messages (a function call joins the assistant message before it)."""
    if not isinstance(item, dict):
        raise FieldError(where, f"'{where}' must be an object (a message or a function call item).")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise FieldError(f"{where}.role", f"'{where}.role' must be user, assistant, system or developer.")
        content = item.get("content")
        if role == "user" and isinstance(content, list) and any(_attached(p) for p in content):
            return [
                {"role": "user", "content": [_chat_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]}
            ]
        return [{"role": "system" if role == "developer" else role, "content": _text(content, where)}]
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise FieldError(where, f"'{where}' is a function_call without its call_id and name.")
        args = item.get("arguments", "{}")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        last = so_far[-1] if so_far else None
        if last is not None and last["role"] == "assistant":  # parallel calls, or a message then its calls
            last.setdefault("tool_calls", []).append(call)
            return []
        return [{"role": "assistant", "content": "", "tool_calls": [call]}]
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str):
            raise FieldError(where, f"'{where}' is a function_call_output without the call_id it answers.")
        if not isinstance(output, str):
            output = _text(output, where) if isinstance(output, list) else json.dumps(output)
        return [{"role": "tool", "tool_call_id": call_id, "content": output}]
    if kind == "reasoning":
        return []  # a reasoning model's summary from another server: nothing this model can read
    raise FieldError(
        f"{where}.type",
        f"'{where}' is a {kind!r} item; Redline reads message, function_call and function_call_output items.",
    )


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    data = body.chat()
    for m in data["messages"]:
        if m.get("content") == "" and m.get("tool_calls"):
            m["content"] = None
    return ChatCompletionRequest.model_validate(data)


# -- the answer ---------------------------------------------------------------------------------------------------
class Answer:
    """The response object as it grows: its output items, and the events that tell a streamed client of them."""

    def __init__(self, body: ResponsesRequest, name: str):
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.body, self.name = body, name
        self.output: list[dict] = []
        self.seq = 0
        self.status = "in_progress"
        self.usage: Optional[dict] = None
        self.incomplete: Optional[dict] = None

    def event(self, kind: str, **fields) -> dict:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}

    def obj(self) -> dict:
        b = self.body
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        choice = b.tool_choice if b.tool_choice is not None else ("auto" if b.tools else "none")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "model": self.name,
            "output": self.output,
            "instructions": b.instructions,
            "tools": [
                {**t, "strict": t.get("strict", False), "parameters": t.get("parameters") or {}} for t in b.tools or []
            ],
            "tool_choice": choice,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "max_output_tokens": b.max_output_tokens,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "previous_response_id": None,
            "store": False,
            "truncation": "disabled",
            "metadata": b.metadata or {},
            "error": None,
            "incomplete_details": self.incomplete,
            "usage": self.usage,
        }

    def finish(self, result) -> None:
        self.usage = {
            "input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": result.cached_tokens or 0},
            "output_tokens": result.new_tokens,
            "output_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
            "total_tokens": result.prompt_tokens + result.new_tokens,
        }
        if result.finish_reason == "length" and not any(o["type"] == "function_call" for o in self.output):
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            self.status = "completed"


def _message(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "start" else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "in_progress" if status == "start" else "completed",
        "content": content,
    }


def _reasoning(item_id: str, text: str, status: str) -> dict:
    """A reasoning model's thinking as a reasoning item (its text whole; no summary is made)."""
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "in_progress" if status == "start" else "completed",
    }


class _Thinking:
    """The streamed reasoning item: opened by the first thinking delta, closed before the answer's first text (or at
    the end of a reply cut off while thinking)."""

    def __init__(self, answer: "Answer"):
        self.answer, self.item, self.text = answer, None, ""

    def delta(self, piece: str) -> list[dict]:
        out = []
        if self.item is None:
            self.item = "rs_" + uuid.uuid4().hex[:24]
            self.answer.output.append(_reasoning(self.item, "", "start"))
            out.append(self.event("response.output_item.added", item=self.answer.output[-1]))
        self.text += piece
        out.append(self.event("response.reasoning_text.delta", content_index=0, delta=piece, item_id=self.item))
        return out

    def close(self) -> list[dict]:
        if self.item is None or self.answer.output[self.index]["status"] == "completed":
            return []
        self.answer.output[self.index] = _reasoning(self.item, self.text, "completed")
        return [
            self.event("response.reasoning_text.done", content_index=0, text=self.text, item_id=self.item),
            self.event("response.output_item.done", item=self.answer.output[self.index]),
        ]

    @property
    def index(self) -> int:
        return next(i for i, o in enumerate(self.answer.output) if o["id"] == self.item)

    def event(self, kind: str, **fields) -> dict:
        return self.answer.event(kind, output_index=self.index, **fields)


def _call(call, status: str) -> dict:
    return {
        "id": "fc_" + call.id.removeprefix("call_"),
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
        "status": status,
    }


async def events(api, handle, queue, answer: Answer, tools):
    """The streamed response: typed events, in OpenAI's order."""
    held = CallStream(tools.family, tools.names, tools.forced) if tools is not None else None
    yield answer.event("response.created", response=answer.obj())
    yield answer.event("response.in_progress", response=answer.obj())
    text_item: Optional[str] = None
    text = ""
    thinking = _Thinking(answer)

    def open_text():
        nonlocal text_item
        closed = thinking.close()  # the answer begins: the thinking's item is done
        text_item = "msg_" + uuid.uuid4().hex[:24]
        answer.output.append(_message(text_item, "", "start"))
        index = len(answer.output) - 1
        return closed + [
            answer.event("response.output_item.added", output_index=index, item=_message(text_item, "", "start")),
            answer.event(
                "response.content_part.added",
                item_id=text_item,
                output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            ),
        ]

    def delta(piece: str):
        nonlocal text
        out = open_text() if text_item is None else []
        text += piece
        out.append(
            answer.event(
                "response.output_text.delta",
                item_id=text_item,
                output_index=len(answer.output) - 1,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return out

    try:
        result = None
        while True:
            event = await queue.get()
            if isinstance(event, TokenEvent):
                if event.token_id >= 0:
                    api.stats.token()
                for e in thinking.delta(event.reasoning) if event.reasoning else []:
                    yield e
                piece = held.feed(event.text) if held is not None and event.text else event.text
                if piece:
                    for e in delta(piece):
                        yield e
            elif isinstance(event, FinishedEvent):
                result = event.result
                break
            elif isinstance(event, (Failed, Closing)):
                yield answer.event("error", code="server_error", message=ended_early(event, handle), param=None)
                return
        if result.finish_reason in ("error", "cancelled"):
            yield answer.event("error", code="server_error", message=failure(result)[1], param=None)
            return
        for e in thinking.close():  # a reply that ended while it thought
            yield e
        calls = []
        if held is not None:
            rest, calls = held.finish(cut=result.finish_reason == "length")  # a call cut short: dropped
            if rest:
                for e in delta(rest):
                    yield e
        if text_item is not None:
            index = next(i for i, o in enumerate(answer.output) if o["id"] == text_item)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            yield answer.event(
                "response.output_text.done",
                item_id=text_item,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            yield answer.event(
                "response.content_part.done", item_id=text_item, output_index=index, content_index=0, part=part
            )
            answer.output[index] = _message(text_item, text, "completed")
            yield answer.event("response.output_item.done", output_index=index, item=answer.output[index])
        for call in calls:
            item = _call(call, "in_progress")
            answer.output.append(_call(call, "completed"))
            index = len(answer.output) - 1
            yield answer.event("response.output_item.added", output_index=index, item=item)
            for piece in argument_pieces(call.arguments):
                yield answer.event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece
                )
            yield answer.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=call.arguments,
                name=call.name,
            )
            yield answer.event("response.output_item.done", output_index=index, item=answer.output[index])
        answer.finish(result)
        kind = "response.completed" if answer.status == "completed" else "response.incomplete"
        yield answer.event(kind, response=answer.obj())
    finally:
        handle.cancel()
        api.untrack(handle)


def whole(answer: Answer, result, tools) -> dict:
    """The response object of a finished generation."""
    text, calls = (result.text, [])
    if tools is not None:
        text, calls = parse(tools.family, result.text, tools.names, cut=result.finish_reason == "length")
    if result.reasoning:
        answer.output.append(_reasoning("rs_" + uuid.uuid4().hex[:24], result.reasoning, "completed"))
    if text or not calls:
        answer.output.append(_message("msg_" + uuid.uuid4().hex[:24], text, "completed"))
    answer.output.extend(_call(c, "completed") for c in calls)
    answer.finish(result)
    return answer.obj()
