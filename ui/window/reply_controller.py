"""Replies in the window: sending a message, regenerating or editing one, stopping a reply — and showing what each
conversation's ``ChatSession`` (``ui/chat_session.py``) says: its reply growing in the transcript, why it waits,
the gauges (only for the chat on screen), the banner when it fails.

Several chats can be answered at once — the engine decodes their replies together — but one conversation waits
for its own reply before the next message. What is asked while a reply in that chat is being stopped is queued
and runs once it has ended (Regenerate, Edit); what is asked while it still runs is refused with words that say
what to do. The sessions write the database; this writes none of it.
"""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer, Signal
from qasync import asyncSlot

from ...inference import DecodeOptions, SamplingSettings, kv_cache_held
from ..chat_session import CLOSED_NOTE, LOAD_NOTE, ChatSession, Reply, ReplyConfig
from ..chat_view import ChatView, MessageWidget
from ..gauges import GaugesPanel
from ..signals import emit
from ..widgets import Banner
from .parts import Composer, SettingsHolder

STILL_LOADING = "The model is still loading; your message stays in the box. Send it once loading ends."
NOT_LOADED = "No model is loaded. Load one first; your message stays in the box."
UNLOADING = "The model is being unloaded; your message stays in the box. Load a model to send it."
STILL_ANSWERING = "This chat's reply is still being written; your message stays in the box. Stop it (Esc) or wait."
STILL_READING = "{names} is still being read; your message stays in the box. Send it once its chip shows."
EDIT_WHILE_ANSWERING = (
    "This chat's reply is still being written, so its messages cannot be edited yet. Stop it (Esc), then click "
    "Edit again, or wait for it to end."
)
REGENERATE_WHILE_ANSWERING = (
    "This chat's reply is still being written. Stop it (Esc) and click Regenerate again, or wait for it to end."
)
NO_DRAFT = (
    "Speculative decoding needs a draft model, and none is loaded. Choose a draft model in Settings "
    "(a small model of the same family), or pick another strategy such as prompt-lookup."
)
# Banners about this chat's reply or the model that held a message back: stale once that has ended.
HELD_BACK = (STILL_LOADING, NOT_LOADED, UNLOADING, STILL_ANSWERING, EDIT_WHILE_ANSWERING, REGENERATE_WHILE_ANSWERING)
HELD_BACK_ENDING = STILL_READING.format(names="")  # the same, for a banner naming the file
STOPPING = "Stopping…"


class ReplyController(QObject):
    reply_finished = Signal(object)  # GenerationResult, or None when the reply failed before one

    def __init__(
        self,
        store,
        bridge,
        chats,
        view: ChatView,
        composer: Composer,
        gauges: GaugesPanel,
        sampler,
        banner: Banner,
        settings: SettingsHolder,
        models,
        show_settings: Callable[[], None],
        parent: Optional[QObject] = None,
        attachments=None,
        tools=None,
    ):
        """``attachments``: what goes with the next message (``AttachmentsController``), or None; ``tools``: the tools
        of each conversation (``ToolsController``: ``configure(conversation_id, config)``), or None."""
        super().__init__(parent)
        self.attachments = attachments
        self.tools = tools
        self.store, self.bridge, self.chats, self.view = store, bridge, chats, view
        self.composer, self.gauges, self.sampler, self.banner = composer, gauges, sampler, banner
        self.settings, self.models, self.show_settings = settings, models, show_settings
        self.sessions: dict[int, ChatSession] = {}
        self.editing_message_id: Optional[int] = None
        self.last_result = None
        self._widgets: dict[int, MessageWidget] = {}  # message id of a reply being written -> its widget
        chats.leaving.connect(self._leaving)
        chats.opened.connect(self._opened)
        chats.deleted.connect(self.stop_in)
        view.regenerate_requested.connect(self.regenerate)
        view.edit_requested.connect(self.edit_message)
        composer.input.submitted.connect(self.send)
        composer.send_button.clicked.connect(self.send)
        composer.stop_button.clicked.connect(lambda: self.stop_in(self.chats.conversation_id))

    # -- sessions ---------------------------------------------------------------------------------------
    def session(self, conversation_id: int) -> ChatSession:
        s = self.sessions.get(conversation_id)
        if s is None:
            s = self.sessions[conversation_id] = ChatSession(self.store, self.bridge, conversation_id, self)
            s.message_added.connect(lambda m, cid=conversation_id: self._show_message(cid, m))
            s.messages_removed.connect(lambda mid, cid=conversation_id: self._removed(cid, mid))
            s.reply_started.connect(self._started)
            s.waiting.connect(self._show_waiting)
            s.grew.connect(self._grew)
            s.live.connect(self._live)
            s.latencies.connect(lambda ms, cid=conversation_id: self._latencies(cid, ms))
            s.notice.connect(lambda text: self.banner.show_message(text, "warning"))
            s.reply_finished.connect(self._finished)
            s.busy_changed.connect(self.update_controls)
        return s

    def _running(self) -> list[Reply]:
        return [s.reply for s in self.sessions.values() if s.reply is not None]

    def busy(self) -> bool:
        """Some reply is being written (in any chat)."""
        return any(s.busy for s in self.sessions.values())

    def busy_in(self, conversation_id: Optional[int]) -> bool:
        """A reply is being written in this conversation: its next message waits for it."""
        s = self.sessions.get(conversation_id) if conversation_id is not None else None
        return s is not None and s.busy

    @property
    def current(self) -> Optional[Reply]:
        """The reply being written in the chat on screen, else any reply being written."""
        s = self.sessions.get(self.chats.conversation_id) if self.chats.conversation_id is not None else None
        if s is not None and s.reply is not None:
            return s.reply
        running = self._running()
        return running[-1] if running else None

    def running(self) -> list[Reply]:
        return self._running()

    def total_tokens_per_s(self) -> float:
        """What the engine writes in all, over every reply running."""
        return sum(r.tokens_per_s for r in self._running())

    # -- Send and Stop --------------------------------------------------------------------------------------
    def update_controls(self) -> None:
        """Send and Stop, and the chat's placeholder line, follow the model and the chat on screen."""
        s = self.sessions.get(self.chats.conversation_id) if self.chats.conversation_id is not None else None
        generating, stopping = s is not None and s.busy, s is not None and s.stopping
        c = self.composer
        c.send_button.setEnabled(not generating)
        c.stop_button.setEnabled(generating and not stopping)
        c.stop_button.setText(STOPPING if stopping else "Stop")
        c.stop_button.setToolTip(
            "Stopping this chat's reply; what you asked for meanwhile runs once it has ended"
            if stopping
            else "Stop the reply (Esc); what was generated is kept"
        )
        loaded = self.models.loaded
        if loaded is None:
            self.view.set_placeholder(
                "Loading the model…"
                if self.models.loading
                else "No model loaded. Choose one in Model → Configure model… or Model → Settings."
            )
        else:
            self.view.set_placeholder(f"Chatting with {loaded.name}. Type a message below.")

    # -- stopping -------------------------------------------------------------------------------------------
    def stop_in(self, conversation_id: Optional[int], reason: Optional[str] = None) -> None:
        s = self.sessions.get(conversation_id) if conversation_id is not None else None
        if s is not None:
            s.stop(reason)

    def stop_all(self, reason: Optional[str] = None) -> None:
        for s in list(self.sessions.values()):
            s.stop(reason)

    def escape(self) -> bool:
        """Esc in the chat: stop this chat's reply, or drop what was queued behind its stop. True if it did."""
        s = self.sessions.get(self.chats.conversation_id) if self.chats.conversation_id is not None else None
        if s is None or not s.busy:
            return False
        if s.stopping:
            s.after_reply(None)  # Esc again: what was asked meanwhile (a Regenerate, an Edit) does not run
            return True
        s.stop()
        return True

    # -- editing a sent message -------------------------------------------------------------------------------
    def edit_message(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None:
            return
        s = self.sessions.get(m.conversation_id)
        if s is not None and s.busy:
            if s.stopping:  # Esc was pressed a moment ago: the edit opens as soon as that reply has ended
                s.after_reply(lambda: self.edit_message(message_id))
                return
            self.banner.show_message(EDIT_WHILE_ANSWERING, "info")
            return
        self.editing_message_id = message_id
        self.composer.edit_bar.show()
        self.composer.input.setPlainText(m.content)
        if self.attachments is not None:  # its files come back as chips, to keep, remove or add to
            self.attachments.restore(m)
        self.composer.input.setFocus()

    def end_edit(self) -> None:
        self.editing_message_id = None
        self.composer.edit_bar.hide()

    # -- asking -------------------------------------------------------------------------------------------------
    def reply_config(self) -> ReplyConfig:
        """How the next reply is asked for, from the settings and the model loaded."""
        s, loaded = self.settings.value, self.models.loaded
        sampling = SamplingSettings(
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
        )
        options = DecodeOptions(strategy=self.models.strategy(), num_draft_tokens=s.num_draft_tokens)
        refusal = NO_DRAFT if options.strategy == "speculative" and not loaded.draft_name else None
        return ReplyConfig(
            loaded.name,
            sampling,
            options,
            s.context_length,
            loaded.precision,
            loaded.device,
            refusal=refusal,
            thinking=s.thinking_setting() if hasattr(s, "thinking_setting") else None,
        )

    def config_for(self, conversation_id: int) -> ReplyConfig:
        """``reply_config()``, through the tool loop where this conversation has tools on."""
        config = self.reply_config()
        return self.tools.configure(conversation_id, config) if self.tools is not None else config

    def _refused(self) -> bool:
        """Said in the banner (the text staying in the box) when nothing can be sent now."""
        if self.models.unloading:
            self.banner.show_message(UNLOADING, "warning")
            return True
        if self.models.loaded is None:
            if self.models.loading:
                self.banner.show_message(STILL_LOADING, "info")
            else:
                self.banner.show_message(
                    NOT_LOADED,
                    "warning",
                    [("Use the starter model", self.models.use_starter), ("Open settings", self.show_settings)],
                )
            return True
        return False

    @asyncSlot()
    async def send(self) -> None:
        text = self.composer.input.message_text().strip()
        pending = self.attachments.pending() if self.attachments is not None else []
        reading = self.attachments.reading() if self.attachments is not None else []
        if not text and not pending and not reading:
            return
        if self.busy_in(self.chats.conversation_id):
            self.banner.show_message(STILL_ANSWERING, "info")
            return
        if reading:
            self.banner.show_message(STILL_READING.format(names=", ".join(reading)), "info")
            return
        if self._refused():
            return
        text_of_banner = self.banner.label.text()
        if text_of_banner in HELD_BACK or text_of_banner.endswith(HELD_BACK_ENDING):
            self.banner.hide()  # the message it held back is going out now: the notice is stale
        replace_from = self.editing_message_id
        self.end_edit()
        conversation_id = self.chats.ensure_open(text or pending[0].attachment.name)
        self.composer.input.clear()
        if self.attachments is not None:
            self.attachments.clear()  # the chips go with the message; a refused reply leaves them in the chat
        items, sources = [p.attachment for p in pending], [p.source for p in pending]
        self.session(conversation_id).send(text, self.config_for(conversation_id), replace_from, items, sources)

    @asyncSlot(int)
    async def regenerate(self, message_id: int) -> None:
        m = self.store.message(message_id)
        if m is None or m.role != "assistant":
            return
        s = self.session(m.conversation_id)
        if s.busy:
            if s.stopping:  # queued: it runs once the stop has ended that reply (the latest click wins)
                s.after_reply(lambda: self.regenerate(message_id))
                return
            self.banner.show_message(REGENERATE_WHILE_ANSWERING, "info")
            return
        if self.models.loaded is None or self.models.unloading:
            self._refused()
            return
        s.regenerate(message_id, self.config_for(m.conversation_id))

    # -- what the sessions say -----------------------------------------------------------------------------------
    def _show_message(self, conversation_id: int, m) -> None:
        if self.chats.showing(conversation_id):
            attached = getattr(m, "attachments", None) or ()
            self.view.add_message(m.id, m.role, m.content, m.stats, m.partial, m.position, attached)

    def _removed(self, conversation_id: int, message_id: int) -> None:
        if self.chats.showing(conversation_id):
            self.view.remove_from(message_id)

    def _started(self, reply: Reply) -> None:
        if self.chats.showing(reply.conversation_id):
            # Only the new reply's widget is built; earlier ones stay as they are. In the next event-loop turn:
            # the user's message widget was just built in this one, and each costs a frame's worth of time.
            QTimer.singleShot(0, lambda: self._show_reply(reply))
            self.gauges.start_reply()
        self.sampler.set_fast(True)

    def _show_waiting(self, reply: Reply) -> None:
        """A reply the engine has not started yet says so in its bubble (and why) instead of "generating…"."""
        widget = self._widget(reply)
        if widget is not None:
            widget.set_waiting(reply.waiting)

    def _grew(self, reply: Reply) -> None:
        widget = self._widget(reply)
        if widget is not None:
            widget.text = reply.text
            widget.draft_spans = reply.draft_spans
            widget.thinking.set_text(reply.reasoning)
            widget.mark_dirty()

    def _live(self, reply: Reply) -> None:
        if self.chats.showing(reply.conversation_id):  # the gauges show the chat on screen
            self.gauges.live(reply.tokens_per_s, reply.ttft_ms, reply.new_tokens, self.total_tokens_per_s(), source="")

    def _latencies(self, conversation_id: int, ms: list) -> None:
        if self.chats.showing(conversation_id):
            self.gauges.add_latencies(ms)

    def _finished(self, reply: Reply) -> None:
        if not self._running():
            self.sampler.set_fast(False)
        result, on_screen = reply.result, self.chats.showing(reply.conversation_id)
        if result is not None and on_screen:
            self.gauges.finish_reply(
                result.tokens_per_s, result.ttft_ms, result.new_tokens, result.p50_ms, result.p95_ms, source=""
            )
        shown = self._widget(reply)
        self._widgets.pop(reply.message_id, None)
        if (
            shown is None
            and on_screen
            and self.view.showing_latest()
            and self.view.widget_for(reply.message_id) is None
        ):
            # It ended before its widget was due to be built.
            shown = self.view.add_message(
                reply.message_id, "assistant", reply.text, reply.stats, reply.partial, reply.position
            )
        if shown is not None:
            shown.streaming = False
            shown.thinking.set_text(reply.reasoning)
            shown.set_content(reply.text, reply.stats, reply.partial)
            shown.render()
        if on_screen and self.banner.label.text() in HELD_BACK:
            self.banner.hide()  # "still being written": it is not any more
        if reply.error:
            self.banner.show_message(
                f"The reply failed: {reply.error} Your conversation is kept.",
                "error",
                [("Open settings", self.show_settings)],
            )
        self.gauges.set_kv_cache(kv_cache_held(self.bridge.engine))  # what the next turn may reuse
        self.chats.touch(reply.conversation_id)
        self.last_result = result
        self.update_controls()
        emit(self.reply_finished, result)

    # -- the widget showing a reply ---------------------------------------------------------------------------
    def _attach(self, reply: Reply, widget: MessageWidget) -> None:
        widget.streaming = True
        widget.stats = {}  # the stored placeholder's "interrupted" is for a reply that did not end; this one runs
        widget.waiting = reply.waiting
        widget.text = reply.text
        widget.draft_spans = reply.draft_spans
        widget.thinking.set_text(reply.reasoning)
        widget.render()
        self._widgets[reply.message_id] = widget

    def _show_reply(self, reply: Reply) -> None:
        if (
            not reply.finished
            and self.chats.showing(reply.conversation_id)
            and self.view.widget_for(reply.message_id) is None
        ):
            self._attach(reply, self.view.add_message(reply.message_id, "assistant", "", None, True, reply.position))

    def _widget(self, reply: Reply) -> Optional[MessageWidget]:
        """The widget showing the growing reply, if it is built: scrolling far up drops it from the view's
        window, and scrolling back down builds it again from the store, so look it up when it is gone."""
        widget = self._widgets.get(reply.message_id)
        if widget is not None and widget in self.view.widgets:
            return widget
        self._widgets.pop(reply.message_id, None)
        if self.chats.showing(reply.conversation_id) and not reply.finished:
            widget = self.view.widget_for(reply.message_id)
            if widget is not None:
                self._attach(reply, widget)
                return widget
        return None

    def _leaving(self) -> None:
        """The view is about to show another page or conversation: its widgets go, and so does edit mode."""
        self._widgets.clear()
        self.end_edit()

    def _opened(self, conversation_id: Optional[int]) -> None:
        """The view now shows ``conversation_id``: a reply being written there streams into its widget, and
        the gauges follow it."""
        s = self.sessions.get(conversation_id) if conversation_id is not None else None
        if s is not None and s.reply is not None:
            self.gauges.start_reply()
            widget = self.view.widget_for(s.reply.message_id)
            if widget is not None:
                self._attach(s.reply, widget)
        self.update_controls()  # Send and Stop follow the chat on screen

    # -- closing --------------------------------------------------------------------------------------------------
    def stop_for_load(self) -> None:
        """A load takes the engine: every reply stops, each saying so (the engine stops them too)."""
        self.stop_all(LOAD_NOTE)

    def shutdown(self) -> None:
        """The window closes: every reply still running is stopped (the engine is stopped next)."""

        for s in self.sessions.values():
            s.after_reply(None)
            s.stop(CLOSED_NOTE)

    def close_sessions(self) -> None:
        """After the engine stopped: each reply still running is saved with what the engine sent."""
        for s in list(self.sessions.values()):
            s.close()


__all__ = [
    "EDIT_WHILE_ANSWERING",
    "NOT_LOADED",
    "REGENERATE_WHILE_ANSWERING",
    "ReplyController",
    "STILL_ANSWERING",
    "STILL_LOADING",
    "UNLOADING",
]
