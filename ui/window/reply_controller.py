"""Replies in the window: sending a message, regenerating or editing one, stopping a reply, and what the
database holds while a reply is written.

Each reply is a ``Reply``: its conversation and message, its own request to the engine (its events are
handed to that reply, never to "the current one"; its cancel stops it and nothing else), its text so far
and the widget showing it. Several chats can be answered at once — the engine decodes their replies
together — but one conversation waits for its own reply before the next message (``busy_in``).

The database is written from here, on the UI thread, in small transactions: the user's message when sent,
the assistant's as soon as its reply starts (marked partial), updated about once a second while it grows,
and finalised when it ends; on shutdown a reply still running is saved as it stands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from PySide6.QtCore import QObject, QTimer
from qasync import asyncSlot

from redline.inference import (
    DecodeOptions,
    GenerationRequest,
    Notice,
    PrefillProgress,
    Queued,
    SamplingSettings,
    Started,
    StatsEvent,
    TokenEvent,
)
from redline.ui.chat_view import MessageWidget
from redline.ui.engine_client import TaskFailed
from redline.ui.markdown import append_reply

SAVE_INTERVAL_S = 1.0  # how often a growing reply is written to the database
STILL_LOADING = "The model is still loading; your message stays in the box. Send it once loading ends."
NOT_LOADED = "No model is loaded. Load one first; your message stays in the box."
UNLOADING = "The model is being unloaded; your message stays in the box. Load a model to send it."
STILL_ANSWERING = "This chat's reply is still being written; your message stays in the box. Stop it (Esc) or wait."

STATS_KEYS = (
    "new_tokens",
    "prompt_tokens",
    "tokens_per_s",
    "ttft_ms",
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
)


def stats_from_result(result, model: str, draft_spans: list) -> dict:
    """What is stored with a finished reply (and shown under it): the measured figures, labelled."""
    stats = {k: getattr(result, k) for k in STATS_KEYS}
    stats["model"] = model
    stats["draft_spans"] = draft_spans
    stats["notes"] = [n for n in result.notes if not n.startswith("Traceback")]
    return stats


@dataclass
class Reply:
    """One reply being written: where it goes, its event stream, and what has arrived so far."""

    conversation_id: int
    message_id: int
    model: str = ""
    position: int = 0  # the reply's place in its conversation
    future: object = None  # this reply's request to the engine (cancel it to stop this reply alone)
    text: str = ""
    draft_spans: list = field(default_factory=list)
    widget: Optional[MessageWidget] = None
    last_token_time: Optional[float] = 0.0
    last_save: float = field(default_factory=time.monotonic)
    finished: bool = False
    waiting: str = ""  # why the engine has not started it yet ("waiting for the speed lab"), while it waits
    tokens_per_s: float = 0.0  # its own rolling speed
    new_tokens: int = 0
    ttft_ms: Optional[float] = None
    after_finish: list = field(default_factory=list)  # what waits for this reply to end (an edit after Esc)
    stopping: bool = False  # Stop was pressed; the engine ends it at its next step

    def append(self, delta: str, from_draft: bool) -> None:
        self.text = append_reply(self.text, self.draft_spans, delta, from_draft)


class ReplyController(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._running: list[Reply] = []
        self.editing_message_id: Optional[int] = None
        self.last_result = None

    # -- which replies run ------------------------------------------------------------
    def busy(self) -> bool:
        """Some reply is being written (in any chat)."""
        return bool(self._running)

    def busy_in(self, conversation_id: Optional[int]) -> bool:
        """A reply is being written in this conversation: its next message waits for it."""
        return any(r.conversation_id == conversation_id for r in self._running)

    @property
    def current(self) -> Optional[Reply]:
        """The reply being written, if any (the newest, should there ever be several)."""
        return self._running[-1] if self._running else None

    def running(self) -> list[Reply]:
        return list(self._running)

    # -- stopping -----------------------------------------------------------------------
    def stop(self, reply: Optional[Reply] = None) -> None:
        """Stop ``reply`` (by default the current one); what was generated is kept."""
        reply = reply or self.current
        if reply is not None and not reply.finished:
            reply.stopping = True
            self.window.client.cancel(reply.future)  # this reply's own request: no other stops

    def stop_in(self, conversation_id: int) -> None:
        for reply in self.running():
            if reply.conversation_id == conversation_id:
                self.stop(reply)

    def stop_all(self) -> None:
        for reply in self.running():
            self.stop(reply)

    # -- editing a sent message ------------------------------------------------------------
    def edit_message(self, message_id: int) -> None:
        w = self.window
        m = w.store.message(message_id)
        if m is None:
            return
        running = next((r for r in self._running if r.conversation_id == m.conversation_id), None)
        if running is not None:
            if running.stopping:
                # Esc was pressed a moment ago: the edit opens as soon as that reply has ended.
                running.after_finish.append(lambda: self.edit_message(message_id))
                return
            w.banner.show_message(STILL_ANSWERING, "info")
            return
        self.editing_message_id = message_id
        w.edit_bar.show()
        w.input.setPlainText(m.content)
        w.input.setFocus()

    def end_edit(self) -> None:
        self.editing_message_id = None
        self.window.edit_bar.hide()

    # -- starting a reply -----------------------------------------------------------------
    @asyncSlot()
    async def send(self) -> None:
        w = self.window
        text = w.input.message_text().strip()
        if not text:
            return
        if self.busy_in(w.conversation_id):
            w.banner.show_message(STILL_ANSWERING, "info")
            return
        if w.models.unloading:
            w.banner.show_message(UNLOADING, "warning")
            return
        if w.loaded is None:
            if w.loading:
                w.banner.show_message(STILL_LOADING, "info")
            else:
                w.banner.show_message(
                    NOT_LOADED,
                    "warning",
                    [("Use the starter model", w.use_starter), ("Open settings", w.show_settings)],
                )
            return
        if w.banner.label.text() in (STILL_LOADING, NOT_LOADED, UNLOADING, STILL_ANSWERING):
            w.banner.hide()  # the message it held back is going out now: the notice is stale
        if self.editing_message_id is not None:
            w.store.delete_from(self.editing_message_id)
            w.chat_view.remove_from(self.editing_message_id)
            self.end_edit()
        conversation_id = w.chats.ensure_open(text)
        user = w.store.add_message(conversation_id, "user", text)
        w.chat_view.add_message(user.id, "user", text, position=user.position)
        w.input.clear()
        await self._generate(conversation_id)

    @asyncSlot(int)
    async def regenerate(self, message_id: int) -> None:
        w = self.window
        if w.loaded is None:
            w.banner.show_message(NOT_LOADED, "warning", [("Use the starter model", w.use_starter)])
            return
        m = w.store.message(message_id)
        if m is None or m.role != "assistant":
            return
        if self.busy_in(m.conversation_id):
            w.banner.show_message(STILL_ANSWERING, "info")
            return
        w.store.delete_from(message_id)
        if w.chats.showing(m.conversation_id):
            w.chat_view.remove_from(message_id)
        await self._generate(m.conversation_id)

    async def _generate(self, conversation_id: int) -> None:
        w = self.window
        store = w.store
        conv = store.conversation(conversation_id)
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
        messages += [{"role": m.role, "content": m.content} for m in store.messages(conversation_id) if m.content]
        s = w.settings
        placeholder = store.add_message(
            conversation_id,
            "assistant",
            "",
            partial=True,
            stats={"finish_reason": "interrupted", "model": w.loaded.name},
        )
        reply = Reply(conversation_id, placeholder.id, model=w.loaded.name, position=placeholder.position)
        self._running.append(reply)
        if w.chats.showing(conversation_id):
            # Only the new reply's widget is built; earlier ones stay as they are. In the next event-loop turn:
            # the user's message widget was just built in this one, and each costs a frame's worth of time.
            QTimer.singleShot(0, lambda: self._show_reply(reply))
        w.gauges.start_reply()
        w.sampler.set_fast(True)
        w.update_controls()
        sampling = SamplingSettings(
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
        )
        options = DecodeOptions(strategy=w.models.strategy(), num_draft_tokens=s.num_draft_tokens)
        result, error = None, None
        if options.strategy == "speculative" and (w.loaded is None or not w.loaded.draft_name):
            error = (
                "Speculative decoding needs a draft model, and none is loaded. Choose a draft model in Settings "
                "(a small model of the same family), or pick another strategy such as prompt-lookup."
            )
        else:
            request = GenerationRequest(
                messages=messages, sampling=sampling, options=options, context=s.context_length, client="chat"
            )
            reply.future = w.client.generate(request, lambda events: self._on_events(reply, events))
            try:
                result = await reply.future
            except TaskFailed as exc:
                error = str(exc)
        if w.has_shut_down:
            return
        self._finish(reply, result, error)

    # -- while it is written --------------------------------------------------------------
    def _on_events(self, reply: Reply, events: list) -> None:
        if reply.finished:
            return
        w = self.window
        latencies = []
        for ev in events:
            if isinstance(ev, Queued):
                reply.waiting = ev.reason
                self._show_waiting(reply)
            elif isinstance(ev, Started):
                reply.waiting = ""
                self._show_waiting(reply)
            elif isinstance(ev, Notice):  # e.g. part of a long message was left out: said before the reply
                w.banner.show_message(ev.text, "warning")
            elif isinstance(ev, PrefillProgress):
                reply.waiting = f"reading the prompt: {ev.done:,} of {ev.total:,} tokens"
                self._show_waiting(reply)
            elif isinstance(ev, TokenEvent):
                if reply.waiting:
                    reply.waiting = ""
                    self._show_waiting(reply)
                reply.append(ev.text, ev.from_draft)
                if ev.token_id != -1:  # -1: the final text delta, not a token (a server's tokens are -2)
                    if reply.last_token_time is not None and ev.index > 0 and ev.time_s > reply.last_token_time:
                        latencies.append((ev.time_s - reply.last_token_time) * 1000)
                    reply.last_token_time = ev.time_s
            elif isinstance(ev, StatsEvent):
                reply.tokens_per_s = ev.tokens_per_s_1s
                reply.new_tokens, reply.ttft_ms = ev.new_tokens, ev.ttft_ms
                if reply.conversation_id == w.conversation_id:  # the gauges show the chat on screen
                    w.gauges.live(ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens, self.total_tokens_per_s())
        w.gauges.add_latencies(latencies)
        widget = self._stream_widget(reply)
        if widget is not None:
            widget.text = reply.text
            widget.draft_spans = reply.draft_spans
            widget._dirty = True
        now = time.monotonic()
        if now - reply.last_save >= SAVE_INTERVAL_S:
            reply.last_save = now
            w.store.update_message(reply.message_id, reply.text, partial=True)

    def total_tokens_per_s(self) -> float:
        """What the engine writes in all, over every reply running."""
        return sum(r.tokens_per_s for r in self._running)

    def _show_waiting(self, reply: Reply) -> None:
        """A reply the engine has not started yet says so in its bubble (and why) instead of "generating…"."""
        widget = self._stream_widget(reply)
        if widget is not None and hasattr(widget, "set_waiting"):
            widget.set_waiting(reply.waiting)

    # -- the widget showing a reply -------------------------------------------------------
    def _attach_stream(self, reply: Reply, widget: MessageWidget) -> None:
        widget.streaming = True
        widget.stats = {}  # the stored placeholder's "interrupted" is for a reply that did not end; this one runs
        widget.waiting = reply.waiting
        widget.text = reply.text
        widget.draft_spans = reply.draft_spans
        widget.render()
        reply.widget = widget

    def _show_reply(self, reply: Reply) -> None:
        view = self.window.chat_view
        if (
            not reply.finished
            and self.window.chats.showing(reply.conversation_id)
            and view.widget_for(reply.message_id) is None
        ):
            self._attach_stream(reply, view.add_message(reply.message_id, "assistant", "", None, True, reply.position))

    def _stream_widget(self, reply: Reply) -> Optional[MessageWidget]:
        """The widget showing the growing reply, if it is built: scrolling far up drops it from the view's
        window, and scrolling back down builds it again from the store, so look it up when it is gone."""
        view = self.window.chat_view
        if reply.widget is not None and reply.widget in view.widgets:
            return reply.widget
        reply.widget = None
        if self.window.chats.showing(reply.conversation_id):
            widget = view.widget_for(reply.message_id)
            if widget is not None:
                self._attach_stream(reply, widget)
                return widget
        return None

    def detach_widgets(self) -> None:
        """The view is about to show another page or conversation: its widgets go."""
        for reply in self._running:
            reply.widget = None

    def reattach(self, conversation_id: int) -> None:
        """The view now shows ``conversation_id``: a reply being written there streams into its widget."""
        for reply in self._running:
            if reply.conversation_id == conversation_id:
                widget = self.window.chat_view.widget_for(reply.message_id)
                if widget is not None:
                    self._attach_stream(reply, widget)

    # -- when it ends -----------------------------------------------------------------------
    def _finish(self, reply: Reply, result, error: Optional[str]) -> None:
        w = self.window
        self._running.remove(reply)
        reply.finished = True
        w.sampler.set_fast(False)
        if result is not None:
            reply.text = result.text
            stats = stats_from_result(result, reply.model, reply.draft_spans)
            partial = result.finish_reason in ("cancelled", "error")
            if result.finish_reason == "error":
                error = result.error
            w.gauges.finish_reply(result.tokens_per_s, result.ttft_ms, result.new_tokens, result.p50_ms, result.p95_ms)
        else:
            stats = {"finish_reason": "error", "error": error, "model": reply.model, "draft_spans": reply.draft_spans}
            partial = True
        shown = self._stream_widget(reply)
        view = w.chat_view
        if reply.text:
            w.store.update_message(reply.message_id, reply.text, partial, stats)
            if (
                shown is None
                and w.chats.showing(reply.conversation_id)
                and view.showing_latest()
                and view.widget_for(reply.message_id) is None
            ):
                # It ended before its widget was due to be built.
                shown = view.add_message(reply.message_id, "assistant", reply.text, stats, partial, reply.position)
            if shown is not None:
                shown.streaming = False
                shown.set_content(reply.text, stats, partial)
                shown.render()
        else:  # nothing came out: an empty message would only be clutter
            w.store.delete_from(reply.message_id)
            if shown is not None:
                view.remove_from(reply.message_id)
        reply.widget = None
        if error:
            w.banner.show_message(
                f"The reply failed: {error} Your conversation is kept.",
                "error",
                [("Open settings", w.show_settings)],
            )
        w.conversations.touch(reply.conversation_id)
        self.last_result = result
        w.update_controls()
        w.reply_finished.emit(result)
        for then in reply.after_finish:
            then()

    def shutdown(self) -> None:
        """The window closes: each reply still running stops, and is saved as it stands (partial, with the
        figures it had so far); one that had not written a word yet is removed rather than left empty."""
        w = self.window
        for reply in self.running():
            w.client.cancel(reply.future)
            if not reply.text:
                w.store.delete_from(reply.message_id)
            else:
                stats = {
                    "finish_reason": "cancelled",
                    "model": reply.model,
                    "draft_spans": reply.draft_spans,
                    "new_tokens": reply.new_tokens or None,
                    "tokens_per_s": reply.tokens_per_s or None,
                    "ttft_ms": reply.ttft_ms,
                    "notes": ["Stopped because Redline was closed."],
                }
                w.store.update_message(reply.message_id, reply.text, True, stats)
            reply.finished = True
        self._running.clear()
