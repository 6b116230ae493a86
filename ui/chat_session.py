"""One conversation's replies, without a window: ``ChatSession`` writes the user's message, asks the engine for the
reply (one ``Channel``: its events, ending in the result), keeps what has arrived, writes the database as the
reply grows and when it ends, and says what happens through its signals. The window (``ui/window/
reply_controller.py``) only shows what the sessions say; a test drives a session with a store and an
``EngineBridge`` alone.

Every reply leaves a line in the conversation: a reply stopped or failed before its first word is kept as an
empty assistant message whose note says why ("Stopped before it started: you stopped it while it was waiting
for the speed lab."), so the conversation never holds two user turns in a row without a word between them.
Every stopped reply is saved with the engine's measured figures; when Redline closes mid-reply the figures
are the engine's too (its result, once the engine has stopped), or, if the engine did not stop in time, the
ones measured here from the tokens that arrived (never a 1-second gauge reading as the reply's speed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from PySide6.QtCore import QObject, Signal

from ..inference import (
    DecodeOptions,
    Failed,
    FinishedEvent,
    GenerationRequest,
    Notice,
    PrefillProgress,
    Queued,
    SamplingSettings,
    Started,
    StatsEvent,
    Thinking,
    TokenEvent,
    calls_text,
    decode_tokens_per_s,
    percentile,
    token_latencies_ms,
)
from .bridge import TaskFailed, user_message
from .markdown import append_reply
from .signals import emit

SAVE_INTERVAL_S = 1.0  # how often a growing reply is written to the database
CLOSED_NOTE = "Stopped because Redline was closed."
LOAD_NOTE = "Stopped so that the model to load could start."
UNLOAD_NOTE = "Stopped so that the model to unload could start."

STATS_KEYS = (
    "citations",  # a long document's excerpts the reply was given (number, name, page, chunk, text)
    "new_tokens",
    "prompt_tokens",
    "cached_tokens",
    "tokens_per_s",
    "ttft_ms",
    "queued_ms",  # its wait before its own work began (behind another reply, the speed lab), apart from TTFT
    "p50_ms",
    "p95_ms",
    "strategy",
    "precision",
    "device",
    "finish_reason",
    "error",
    "draft_proposed",
    "draft_accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "peak_memory_bytes",
    "total_s",
    "server_timings",
    # a reasoning model's reply: its thinking's tokens (the rest are the answer's), the time to its first answer token,
    # its thinking time, its thinking's and its answer's own speed (inference/reasoning/)
    "reasoning_format",
    "reasoning_tokens",
    "ttfat_ms",
    "thinking_ms",
    "thinking_tokens_per_s",
    "answer_tokens_per_s",
)


def stats_from_result(result, model: str, draft_spans: list, waited_for: str = "") -> dict:
    """What is stored with a finished reply (and shown under it): the measured figures, labelled. A prompt of
    0 tokens was never measured (a request that ended before its prompt was read, a server that hung up): it
    is stored as unknown, not as zero. ``waited_for``: what its wait was for ("the speed lab"), as the engine
    said while it waited."""
    stats = {k: getattr(result, k, None) for k in STATS_KEYS}
    if not stats.get("prompt_tokens"):
        stats["prompt_tokens"] = None
    stats["model"] = model
    stats["draft_spans"] = draft_spans
    if waited_for:
        stats["waited_for"] = waited_for
    stats["notes"] = [n for n in result.notes if not n.startswith("Traceback")]
    return stats


def prompt_messages(store, conversation_id: int, tool_rounds: bool = False) -> list[dict]:
    """The conversation as the engine reads it: its system prompt first, then every message with words (or
    attachments) in it; two user messages in a row (a reply that never started between them) are joined into one
    turn. A user message with attachments carries them (``"attachments"``: its Documents and Images, in order),
    earlier turns' too: the engine's prompt builder decides what of them to keep. ``tool_rounds`` (a reply with tools
    on): an earlier reply through the tool loop is given as the loop left it, its calls and their results included."""
    conv = store.conversation(conversation_id)
    out: list[dict] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
    for m in store.messages(conversation_id):
        rounds = (m.stats or {}).get("tool_messages") if tool_rounds and m.role == "assistant" else None
        if rounds:
            out += [dict(r) for r in rounds]
            if out[-1]["role"] != "assistant" or out[-1].get("tool_calls"):  # stopped before it answered
                out.append({"role": "assistant", "content": m.content or "(stopped)"})
            continue
        attached = list(getattr(m, "attachments", None) or []) if m.role == "user" else []
        if not m.content and not attached:
            continue
        if out and m.role == "user" and out[-1]["role"] == "user":
            joined = "\n\n".join(t for t in (out[-1]["content"], m.content) if t)
            attached = out[-1].get("attachments", []) + attached
            out[-1] = {"role": "user", "content": joined}
        else:
            out.append({"role": m.role, "content": m.content})
        if attached:
            out[-1]["attachments"] = attached
    return out


@dataclass
class ReplyConfig:
    """How the next reply is asked for: the model's name (stored with it), sampling, decoding, context, and
    what the figures are labelled with should the engine not say (a reply saved as Redline closes)."""

    model: str
    sampling: SamplingSettings
    options: DecodeOptions
    context: Optional[int] = None
    precision: str = ""
    device: str = ""
    refusal: Optional[str] = None  # why this reply cannot be asked for (said as its failure, never sent)
    thinking: Optional[Thinking] = None  # a reasoning model's switch, effort and budget (None: its defaults)
    # The reply runs through the tool loop: ``tools.start(reply, messages, request) -> channel``, where ``request``
    # makes each round's GenerationRequest (ui/window/tools_controller.py); None: an ordinary reply.
    tools: Any = None


@dataclass
class Reply:
    """One reply being written: where it goes, its channel, and what has arrived so far."""

    conversation_id: int
    message_id: int
    model: str = ""
    position: int = 0  # the reply's place in its conversation
    config: Optional[ReplyConfig] = None
    channel: Any = None  # this reply's request to the engine (its cancel stops this reply alone)
    submitted: float = field(default_factory=time.monotonic)
    text: str = ""
    reasoning: str = ""  # a reasoning model's thinking so far, apart from the answer in ``text``
    draft_spans: list = field(default_factory=list)
    waiting: str = ""  # why the engine has not started it yet ("waiting for the speed lab"), or ""
    waited_for: str = ""  # what it waited for before it started ("the speed lab"), the engine's last word on it
    stopping: bool = False  # a stop was asked for; the engine ends it at its next step
    stop_reason: Optional[str] = None  # the note a stop for something else leaves (a load, Redline closing)
    finished: bool = False
    last_save: float = 0.0
    new_tokens: int = 0
    tokens_per_s: float = 0.0  # the last 1-second reading (the gauge's), never stored as the reply's speed
    ttft_ms: Optional[float] = None
    token_times: list = field(default_factory=list)  # seconds since the generation started, per token
    result: Any = None  # the GenerationResult, once it ended
    error: Optional[str] = None  # why it failed, if it did
    stats: dict = field(default_factory=dict)  # what was stored with it at the end
    partial: bool = True

    def append(self, delta: str, from_draft: bool) -> None:
        self.text = append_reply(self.text, self.draft_spans, delta, from_draft)

    def measured_stats(self) -> dict:
        """The figures measured here from the tokens that arrived, for a reply whose result never came."""
        decode = decode_tokens_per_s(self.token_times)
        ttft = self.ttft_ms
        if ttft is None and self.token_times:
            ttft = self.token_times[0] * 1000
        # The engine's definitions (inference/stats.py), from the same arrival times: the p95 saved here is the one
        # the engine's result would have given.
        lat = token_latencies_ms(self.token_times)
        cfg = self.config
        return {
            "new_tokens": len(self.token_times),
            "prompt_tokens": None,
            "tokens_per_s": round(decode, 2) if decode else None,
            "ttft_ms": ttft,
            "p50_ms": percentile(lat, 0.5),
            "p95_ms": percentile(lat, 0.95),
            "strategy": cfg.options.strategy if cfg else None,
            "precision": cfg.precision if cfg else None,
            "device": cfg.device if cfg else None,
            "total_s": round(time.monotonic() - self.submitted, 3),
        }


class ChatSession(QObject):
    """One conversation's replies: one at a time; each its own engine request."""

    message_added = Signal(object)  # a message written to the store (the user's), to show
    messages_removed = Signal(int)  # messages from this id on were deleted (regenerate, an edited message)
    reply_started = Signal(object)  # Reply: its placeholder is in the store
    waiting = Signal(object)  # Reply: why it waits changed (``reply.waiting``; "" once it runs)
    grew = Signal(object)  # Reply: more text
    live = Signal(object)  # Reply: its 1-second speed, TTFT and tokens so far
    latencies = Signal(object)  # a list of ms between this chat's tokens, as they arrive
    notice = Signal(str)  # something to say before the reply (part of a long message was left out)
    reply_finished = Signal(object)  # Reply: ended, saved (``result``, ``error``, ``stats``)
    busy_changed = Signal()  # a reply started or ended, or a stop was asked for

    def __init__(self, store, bridge, conversation_id: int, parent: Optional[QObject] = None):
        super().__init__(parent)
        self.store = store
        self.bridge = bridge
        self.conversation_id = conversation_id
        self.reply: Optional[Reply] = None  # the reply being written
        self.last: Optional[Reply] = None  # the last one that ended
        self._then: Optional[Callable[[], Any]] = None  # what runs once the reply being written has ended

    # -- state ----------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.reply is not None

    @property
    def stopping(self) -> bool:
        return self.reply is not None and self.reply.stopping

    def after_reply(self, then: Optional[Callable[[], Any]]) -> None:
        """Run ``then`` once the reply being written has ended (the latest asked for wins; None drops it)."""
        self._then = then
        emit(self.busy_changed)

    @property
    def queued(self) -> bool:
        return self._then is not None

    # -- asking -----------------------------------------------------------------------------------------
    def send(
        self,
        text: str,
        config: ReplyConfig,
        replace_from: Optional[int] = None,
        attachments: Sequence = (),
        sources: Sequence = (),
    ) -> Reply:
        """Write the user's message (replacing the messages from ``replace_from`` on, an edit) with its
        ``attachments`` (Documents and Images; ``sources[i]``, the original file of ``attachments[i]``, a path or
        its bytes, is kept in the data folder), then ask for the reply. A reply the engine refuses (an image for a
        model that cannot see, a document too long for any context) fails with its sentence; the message and its
        attachments stay in the conversation."""
        if self.busy:
            raise RuntimeError("this conversation's reply is still being written")
        if replace_from is not None:
            self.store.delete_from(replace_from)
            emit(self.messages_removed, replace_from)
        user = self.store.add_message(self.conversation_id, "user", text)
        if attachments:
            self.store.add_attachments(user.id, list(attachments), list(sources))
            user.attachments = self.store.attachments(user.id)
        emit(self.message_added, user)
        return self._start(config)

    def regenerate(self, message_id: int, config: ReplyConfig) -> Reply:
        """Ask again for the reply ``message_id`` (it and what follows it are deleted first)."""
        if self.busy:
            raise RuntimeError("this conversation's reply is still being written")
        self.store.delete_from(message_id)
        emit(self.messages_removed, message_id)
        return self._start(config)

    def _start(self, config: ReplyConfig) -> Reply:
        messages = prompt_messages(self.store, self.conversation_id, tool_rounds=config.tools is not None)
        placeholder = self.store.add_message(
            self.conversation_id,
            "assistant",
            "",
            partial=True,
            stats={"finish_reason": "interrupted", "model": config.model},
        )
        reply = Reply(self.conversation_id, placeholder.id, config.model, placeholder.position, config)
        self.reply = reply
        emit(self.reply_started, reply)
        emit(self.busy_changed)
        if config.refusal:
            self._finish(reply, None, config.refusal)
            return reply

        def request(request_messages: list[dict]) -> GenerationRequest:
            return GenerationRequest(
                messages=request_messages,
                sampling=config.sampling,
                options=config.options,
                context=config.context,
                client="chat",
                thinking=config.thinking,
            )

        if config.tools is not None:  # each round its own request, on the tools' worker thread
            reply.channel = config.tools.start(reply, messages, request)
        else:
            reply.channel = self.bridge.generate(request(messages))
        reply.channel.events.connect(lambda events, r=reply: self._on_events(r, events))
        return reply

    # -- stopping ---------------------------------------------------------------------------------------
    def stop(self, reason: Optional[str] = None) -> bool:
        """Stop the reply being written (what was written is kept); ``reason``, when it is not the user's own
        stop, is the note it leaves. False if nothing was running."""
        reply = self.reply
        if reply is None or reply.finished:
            return False
        if reason and reply.stop_reason is None:
            reply.stop_reason = reason
        if not reply.stopping:
            reply.stopping = True
            emit(self.busy_changed)
        if reply.channel is not None:
            reply.channel.cancel()
        return True

    def close(self) -> None:
        """Redline closes: a reply still running ends now with what the engine sent (its result, if it came),
        else with the figures measured here, and the note that Redline was closed."""
        self._then = None
        reply = self.reply
        if reply is None:
            return
        self.stop(CLOSED_NOTE)
        final = reply.channel.final_from_engine() if reply.channel is not None else None
        if isinstance(final, FinishedEvent):
            self._finish(reply, final.result, None)
        else:
            stats = {**reply.measured_stats(), "finish_reason": "cancelled"}
            self._finish(reply, None, None, stats)

    # -- while it is written ----------------------------------------------------------------------------
    def _on_events(self, reply: Reply, events: list) -> None:
        if reply.finished:
            return
        latencies, grew, live, final = [], False, False, None
        for ev in events:
            if isinstance(ev, Queued):
                self._set_waiting(reply, ev.reason or "waiting in line")
                if ev.reason.startswith("waiting for "):
                    reply.waited_for = ev.reason[len("waiting for ") :]
            elif isinstance(ev, Started):
                self._set_waiting(reply, "")
            elif isinstance(ev, Notice):
                emit(self.notice, ev.text)
            elif isinstance(ev, PrefillProgress):
                self._set_waiting(reply, f"reading the prompt: {ev.done:,} of {ev.total:,} tokens")
            elif isinstance(ev, TokenEvent):
                if reply.waiting:
                    self._set_waiting(reply, "")
                reply.append(ev.text, ev.from_draft)
                reply.reasoning += ev.reasoning
                grew = True
                if ev.token_id != -1:  # -1: the final text delta, not a token (a server's tokens are -2)
                    if reply.token_times and ev.index > 0 and ev.time_s > reply.token_times[-1]:
                        latencies.append((ev.time_s - reply.token_times[-1]) * 1000)
                    reply.token_times.append(ev.time_s)
            elif isinstance(ev, StatsEvent):
                reply.tokens_per_s = ev.tokens_per_s_1s
                reply.new_tokens, reply.ttft_ms = ev.new_tokens, ev.ttft_ms
                live = True
            elif isinstance(ev, (FinishedEvent, Failed)):
                final = ev
        if latencies:
            emit(self.latencies, latencies)
        if live:
            emit(self.live, reply)
        if grew:
            emit(self.grew, reply)
            now = time.monotonic()
            if final is None and now - reply.last_save >= SAVE_INTERVAL_S:
                reply.last_save = now
                self.store.update_message(reply.message_id, reply.text, partial=True, reasoning=reply.reasoning)
        if isinstance(final, FinishedEvent):
            self._finish(reply, final.result, None)
        elif isinstance(final, Failed):
            self._finish(reply, None, user_message(final.error))

    def _set_waiting(self, reply: Reply, why: str) -> None:
        if reply.waiting != why:
            reply.waiting = why
            emit(self.waiting, reply)

    # -- when it ends -------------------------------------------------------------------------------------
    def _why_not_started(self, reply: Reply, result) -> str:
        """The line an empty reply leaves."""
        if reply.stop_reason:
            return reply.stop_reason
        if reply.stopping:  # the user's own stop
            if reply.waiting:
                return f"Stopped before it started: you stopped it while it was {reply.waiting}."
            return "Stopped before it started: you stopped it before its first word."
        notes = [n for n in (result.notes if result is not None else []) if not n.startswith("Traceback")]
        if notes:
            return " ".join(notes)
        return "Stopped before it started."

    def _finish(self, reply: Reply, result, error: Optional[str], stats: Optional[dict] = None) -> None:
        if reply.finished:
            return
        reply.finished = True
        if result is not None:
            reply.text = result.text or reply.text
            reply.reasoning = getattr(result, "reasoning", "") or reply.reasoning
            if getattr(result, "tool_calls", None):
                # A server's calls come apart from its text: they are kept in the reply's text, after it, as Hermes
                # <tool_call> blocks (calls_text, the form the window reads back), so the store needs no column of
                # its own, reopening the conversation shows them again, and the next turn's prompt shows the model
                # its own call as text (a reply without the window's tools: no tool result follows it).
                reply.text = "\n".join(t for t in (reply.text.rstrip(), calls_text(result.tool_calls)) if t)
            stats = stats_from_result(result, reply.model, reply.draft_spans, reply.waited_for)
            partial = result.finish_reason in ("cancelled", "error")
            if result.finish_reason == "error":
                error = result.error or "the engine gave no reason"
        elif stats is not None:  # Redline closing before the result came: what was measured here
            stats = {**stats, "model": reply.model, "draft_spans": reply.draft_spans, "notes": []}
            partial = True
        else:
            stats = {"finish_reason": "error", "error": error, "model": reply.model, "draft_spans": reply.draft_spans}
            stats["notes"] = []
            partial = True
        tool_stats = getattr(reply.channel, "tool_stats", None)
        if tool_stats is not None:  # a reply through the tool loop: its calls and their results are kept with it
            stats.update(tool_stats())
        notes = list(stats.get("notes") or [])
        if reply.stop_reason:  # the reason it was stopped for, once, in place of the engine's own words for it
            notes = [reply.stop_reason] + [n for n in notes if not n.startswith("Stopped") and n != reply.stop_reason]
        if not reply.text:
            if error:
                line = f"No reply: {error}"
            elif stats.get("tool_calls"):  # it did something: its calls, shown above the line
                line = reply.stop_reason or ("Stopped by you before it answered." if reply.stopping else "")
            else:
                line = self._why_not_started(reply, result)
            if line and line not in notes:  # the line says it all: the engine's own "Cancelled before it started." goes
                covered = "before it started" in line
                notes = [line] + [n for n in notes if n not in line and not (covered and "before it started" in n)]
        stats["notes"] = notes
        reply.error, reply.stats, reply.partial, reply.result = error, stats, partial, result
        self.store.update_message(reply.message_id, reply.text, partial, stats, reasoning=reply.reasoning)
        if self.reply is reply:
            self.reply = None
        self.last = reply
        emit(self.reply_finished, reply)
        emit(self.busy_changed)
        then, self._then = self._then, None
        if then is not None:
            then()


__all__ = [
    "CLOSED_NOTE",
    "ChatSession",
    "LOAD_NOTE",
    "Reply",
    "ReplyConfig",
    "STATS_KEYS",
    "TaskFailed",
    "UNLOAD_NOTE",
    "prompt_messages",
    "stats_from_result",
]
