"""Replies in the window: sending a message, regenerating or editing one, stopping a reply, and what the
database holds while a reply is written.

Each reply is a ``Reply``: its conversation and message, its own event stream (an ``EventChannel`` whose
events are handed to that reply, never to "the current one"), its text so far and the widget showing it.
Nothing here assumes that only one reply runs at a time except ``busy()``, which keeps Send and
Regenerate off while one does (the engine runs one task at a time).

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

from redline.inference import StatsEvent, TokenEvent
from redline.ui.chat_view import MessageWidget
from redline.ui.engine_client import EventChannel, TaskFailed, chat_task
from redline.ui.markdown import append_reply

SAVE_INTERVAL_S = 1.0  # how often a growing reply is written to the database
STILL_LOADING = "The model is still loading; your message stays in the box. Send it once loading ends."
NOT_LOADED = "No model is loaded. Load one first; your message stays in the box."

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
    channel: Optional[EventChannel] = None  # this reply's events; ``channel.cancelled`` is its stop request
    text: str = ""
    draft_spans: list = field(default_factory=list)
    widget: Optional[MessageWidget] = None
    last_token_time: Optional[float] = 0.0
    last_save: float = field(default_factory=time.monotonic)
    finished: bool = False

    def append(self, delta: str, from_draft: bool) -> None:
        self.text = append_reply(self.text, self.draft_spans, delta, from_draft)

    def request_stop(self) -> None:
        """Holds even if the reply has not started on the engine thread yet."""
        self.channel.cancelled = True


class ReplyController(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._running: list[Reply] = []
        self.editing_message_id: Optional[int] = None
        self.last_result = None

    # -- which replies run ------------------------------------------------------------
    def busy(self) -> bool:
        """A reply is being written: Send and Regenerate wait (the engine runs one task at a time)."""
        return bool(self._running)

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
            reply.request_stop()
            self.window.client.cancel()

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
        if self.busy():
            return
        m = w.store.message(message_id)
        if m is None:
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
        if not text or self.busy():
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
        if w.banner.label.text() in (STILL_LOADING, NOT_LOADED):
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
        if self.busy() or w.loaded is None:
            return
        m = w.store.message(message_id)
        if m is None or m.role != "assistant":
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
        reply.channel = EventChannel(lambda events: self._on_events(reply, events))
        self._running.append(reply)
        if w.chats.showing(conversation_id):
            # Only the new reply's widget is built; earlier ones stay as they are. In the next event-loop turn:
            # the user's message widget was just built in this one, and each costs a frame's worth of time.
            QTimer.singleShot(0, lambda: self._show_reply(reply))
        w.gauges.start_reply()
        w.sampler.set_fast(True)
        w.update_controls()
        sampling = dict(
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
        )
        options = dict(strategy=w.models.strategy(), num_draft_tokens=s.num_draft_tokens)
        result, error = None, None
        try:
            result = await w.client.run(chat_task(messages, sampling, options, s.context_length, reply.channel))
        except TaskFailed as exc:
            error = str(exc)
        reply.channel.drain()
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
            if isinstance(ev, TokenEvent):
                reply.append(ev.text, ev.from_draft)
                if ev.token_id >= 0:
                    if reply.last_token_time is not None and ev.index > 0 and ev.time_s > reply.last_token_time:
                        latencies.append((ev.time_s - reply.last_token_time) * 1000)
                    reply.last_token_time = ev.time_s
            elif isinstance(ev, StatsEvent):
                w.gauges.live(ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens)
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

    # -- the widget showing a reply -------------------------------------------------------
    def _attach_stream(self, reply: Reply, widget: MessageWidget) -> None:
        widget.streaming = True
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

    def shutdown(self) -> None:
        """The window closes: each reply still running stops, and is saved as it stands (partial)."""
        w = self.window
        for reply in self.running():
            w.client.cancel()
            reply.channel.drain()
            w.store.update_message(
                reply.message_id,
                reply.text,
                True,
                {"finish_reason": "cancelled", "model": reply.model, "draft_spans": reply.draft_spans},
            )
            reply.finished = True
        self._running.clear()
