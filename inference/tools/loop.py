"""The tool loop: generate; where the reply holds tool calls, ask the user about each, run the allowed ones, give the
model their results, and generate again — until a reply without calls, ``max_rounds`` generations, or a stop.

The generation is a function given the messages so far (``generate(messages, round) -> GenerationResult``), so the
same loop serves the CLI, the window and a test's script. A local model's calls are read from its reply's text by
the parsers the server uses (``decoding.tool_calls.read_calls``: every family's syntax); a model on another server
sends them apart, in ``result.tool_calls``. Each round adds the assistant's message with its ``tool_calls`` and one
``tool`` message per call — the result, or why it did not run (refused, unknown tool, bad arguments, stopped) — so
the transcript is always one the model's template and an OpenAI-compatible server take."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..decoding.tool_calls import read_calls
from ..events import GenerationResult
from .approval import PendingCall
from .registry import ToolRegistry

MAX_ROUNDS = 8
MAX_RESULT_CHARS = 16_000  # of one result, given to the model (the rest is left out, with a line saying so)

REFUSED = "The user did not allow this call to {name}; it did not run."
STOPPED = "Not run: the user stopped the reply."
LIMIT = "Not run: the limit of {rounds} rounds of tool calls was reached."


@dataclass
class CallRecord:
    """One call the model made: its tool, arguments, whether the user allowed it, what it gave back and how long it
    took (``ms``, 0 for a call that did not run), in which round."""

    id: str
    name: str
    arguments: Any  # a dict, or the text the model wrote where it was not a JSON object
    approved: bool
    result: str
    is_error: bool = False
    ms: float = 0.0
    round: int = 0
    server: Optional[str] = None
    ran: bool = False

    def to_dict(self, limit: int = 2_000) -> dict:
        result = self.result if len(self.result) <= limit else self.result[:limit] + "…"
        return {
            "name": self.name,
            "server": self.server,
            "arguments": self.arguments,
            "approved": self.approved,
            "ran": self.ran,
            "result": result,
            "is_error": self.is_error,
            "ms": round(self.ms, 1),
            "round": self.round,
        }


@dataclass
class LoopResult:
    """What the loop added to the conversation (``messages``: each round's assistant message with its calls and the
    tool messages, then the final answer), each call, each generation's result, and why it stopped early
    (``stopped``: "cancelled", "max_rounds", "error"; None when the model answered)."""

    messages: list[dict] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    results: list[GenerationResult] = field(default_factory=list)
    stopped: Optional[str] = None

    @property
    def final(self) -> Optional[GenerationResult]:
        return self.results[-1] if self.results else None

    @property
    def answer(self) -> str:
        """The last reply's text before any call it holds (the answer, when the model answered)."""
        last = next((m for m in reversed(self.messages) if m["role"] == "assistant"), None)
        return (last.get("content") or "") if last else ""


def calls_in(result: GenerationResult) -> tuple[str, list[PendingCall]]:
    """(the reply's text before its calls, its calls): a server's ``tool_calls``, else those its text holds."""
    if result.tool_calls:
        calls = []
        for c in result.tool_calls:
            fn = c.get("function") or {}
            calls.append(_pending(c.get("id") or "", fn.get("name") or "", fn.get("arguments") or "{}"))
        return result.text, calls
    content, found = read_calls(result.text)
    return content, [_pending(c.id, c.name, c.arguments) for c in found]


def _pending(call_id: str, name: str, raw: Any) -> PendingCall:
    if isinstance(raw, dict):
        return PendingCall(name, raw, id=call_id, raw_arguments=json.dumps(raw, ensure_ascii=False))
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        value = None
    return PendingCall(name, value if isinstance(value, dict) else {}, id=call_id, raw_arguments=str(raw))


def run_tool_loop(
    generate: Callable[[list[dict], int], GenerationResult],
    messages: list[dict],
    registry: ToolRegistry,
    approve: Callable[[PendingCall], bool],
    max_rounds: int = MAX_ROUNDS,
    should_cancel: Optional[Callable[[], bool]] = None,
    on_call: Optional[Callable[[PendingCall], None]] = None,
    on_result: Optional[Callable[[CallRecord], None]] = None,
    timeout_s: Optional[float] = None,
    max_result_chars: int = MAX_RESULT_CHARS,
) -> LoopResult:
    """Run the loop from ``messages`` (not changed; ``LoopResult.messages`` is what it adds). ``approve(call)``: the
    user's word on a call of an offered tool (the approval policy's ``approver``, the terminal's prompt, a dialog);
    ``should_cancel``: checked before each generation and each call; ``on_call``: a call about to run (approved);
    ``on_result``: each call's record once it has one; ``timeout_s``: an MCP call's limit."""
    cancelled = should_cancel or (lambda: False)
    out = LoopResult()
    history = list(messages)
    for round_ in range(max(1, max_rounds)):
        if cancelled():
            out.stopped = "cancelled"
            return out
        result = generate(history, round_)
        out.results.append(result)
        if result.finish_reason in ("error", "cancelled"):
            out.stopped = "error" if result.finish_reason == "error" else "cancelled"
            return out
        content, calls = calls_in(result)
        if not calls:
            out.messages.append({"role": "assistant", "content": result.text})
            return out
        for i, call in enumerate(calls):
            call.id = call.id or f"call_{round_}_{i}"
            entry = registry.get(call.name)
            call.server = entry.server if entry is not None else None
        assistant = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c)}}
                for c in calls
            ],
        }
        history.append(assistant)
        out.messages.append(assistant)
        last = round_ == max_rounds - 1
        for call in calls:
            if last:
                record = _not_run(call, round_, LIMIT.format(rounds=max_rounds))
                out.stopped = "max_rounds"
            elif cancelled():
                record = _not_run(call, round_, STOPPED)
                out.stopped = "cancelled"
            else:
                record = _run_one(call, round_, registry, approve, on_call, timeout_s, max_result_chars)
            out.calls.append(record)
            tool_message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": record.result}
            history.append(tool_message)
            out.messages.append(tool_message)
            if on_result is not None:
                on_result(record)
        if out.stopped:
            return out
    return out


def _run_one(call, round_, registry, approve, on_call, timeout_s, max_result_chars) -> CallRecord:
    entry = registry.get(call.name)
    shown = call.arguments if call.arguments or not call.raw_arguments.strip() else call.raw_arguments
    if entry is None:
        offered = ", ".join(registry.names) or "none"
        text = f"There is no tool named {call.name!r}; the tools are: {offered}."
        return CallRecord(call.id, call.name, shown, False, text, True, round=round_)
    if not _is_object(call.raw_arguments):
        text = f"The arguments of this call to {call.name} are not a JSON object; it did not run."
        return CallRecord(call.id, call.name, shown, False, text, True, round=round_, server=entry.server)
    if not approve(call):
        return CallRecord(
            call.id, call.name, call.arguments, False, REFUSED.format(name=call.name), round=round_, server=entry.server
        )
    if on_call is not None:
        on_call(call)
    start = time.perf_counter()
    result = registry.call(call.name, call.arguments, timeout_s)
    ms = result.ms or (time.perf_counter() - start) * 1000
    text = result.text
    if len(text) > max_result_chars:
        text = text[:max_result_chars] + f"\n\n[… {len(result.text) - max_result_chars:,} more characters left out]"
    return CallRecord(
        call.id, call.name, call.arguments, True, text, result.is_error, ms, round_, entry.server, ran=True
    )


def _not_run(call: PendingCall, round_: int, why: str) -> CallRecord:
    return CallRecord(call.id, call.name, call.arguments, False, why, round=round_, server=call.server)


def _arguments_text(call: PendingCall) -> str:
    if _is_object(call.raw_arguments):
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False)


def _is_object(text: str) -> bool:
    if not text.strip():
        return True  # no arguments: {}
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
