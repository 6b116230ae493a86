"""Tools in the window's conversations: the **Tools** switch by the message box (off in every conversation until it
is turned on there; kept with the conversation in the store, ``set_tools_on``, so it is as it was left when Redline
starts again), which of the tools it offers (the button's menu, ``ui/tools/choice_menu.py``: every tool ticked until
the user unticks it there; the unticked ones kept with the conversation too), what the ticked tools cost ("tools: 3
of 7 · 1,240 tokens", counted by the engine from the definitions the model is shown), and each reply of a
conversation with tools on run through the tool loop (``ui/tools/run.py``: a worker thread, never the UI thread), its
calls shown in the reply as they come, a call the rules leave to the user asked in its block. Settings → Tools
(``ui/tools/settings_page.py``) edits the servers, Redline's own tools and the limits.

The reply controller asks ``configure(conversation_id, config)`` for each reply; a conversation with tools on gets
this controller as its config's ``tools``, and its ``ChatSession`` calls ``start(reply, messages, request)``."""

from __future__ import annotations

import dataclasses
from typing import Optional

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QLabel, QToolButton

from ...inference import tool_tokens_job
from ..bridge import TaskFailed
from ..chat_view import ChatView
from ..tools.calls_view import ToolCallsPanel
from ..tools.choice_menu import ToolChoice, ToolsMenu
from ..tools.run import ToolRun
from ..tools.service import FAILED, READY, STARTING, ToolsService
from ..widgets import Banner

SYNC_MS = 150  # how often a reply being written is checked for its calls' panel (its widget may have been rebuilt)
WAITING_ELSEWHERE = "A tool call in another chat is waiting for your answer: open that chat to allow or deny it."


class ToolsController(QObject):
    def __init__(
        self,
        service: ToolsService,
        bridge,
        store,
        chats,
        view: ChatView,
        button: QToolButton,
        note: QLabel,
        settings,
        models,
        banner: Banner,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.service, self.bridge, self.store, self.chats, self.view = service, bridge, store, chats, view
        self.button, self.note, self.settings, self.models, self.banner = button, note, settings, models, banner
        self.new_chat_on = False  # the switch in a new chat not saved yet (a conversation's is in the store)
        self.new_chat_unticked: set[str] = set()  # the tools unticked in a new chat not saved yet
        self.runs: dict[int, ToolRun] = {}  # reply's message id -> its loop, while it runs
        self.offered: list[str] = []  # the tools ticked in the chat on screen, as last counted
        self.available = 0  # how many tools there are to tick
        self.tokens: Optional[int] = None  # what the definitions take, for the model loaded (None: not counted)
        self._counted_for: Optional[tuple] = None
        self._counting = None  # the engine's channel counting them
        self._shown: Optional[int] = None
        self._sync = QTimer(self)
        self._sync.setInterval(SYNC_MS)
        self._sync.timeout.connect(self._sync_panels)
        button.setCheckable(True)
        button.toggled.connect(self._toggled)
        # A click turns tools on or off; the arrow beside it chooses which of them this chat offers.
        self.menu = ToolsMenu(self.choices, self.choice_notes, self.set_ticked, self.tick_all, button)
        button.setMenu(self.menu)
        button.setPopupMode(QToolButton.MenuButtonPopup)
        chats.opened.connect(self._opened)
        service.changed.connect(self._servers_changed)
        settings.changed.connect(lambda _s: self._changed())
        models.model_loaded.connect(lambda _r: self._changed())
        models.model_unloaded.connect(self._changed)
        self._show()

    # -- the switch --------------------------------------------------------------------------------------------------
    def on_in(self, conversation_id: Optional[int]) -> bool:
        if conversation_id is None:
            return self.new_chat_on
        self._adopt(conversation_id)
        conv = self.store.conversation(conversation_id)
        return bool(conv is not None and conv.tools_on)

    def set_on(self, on: bool) -> None:
        """The switch for the chat on screen (as a click on it)."""
        self.button.setChecked(on)

    def _adopt(self, conversation_id: int) -> None:
        """A new chat becomes a conversation when its first message is sent: it keeps its switch and its ticks."""
        fresh = self.new_chat_on or self.new_chat_unticked
        if fresh and self._shown is None and self.store.message_count(conversation_id) == 0:
            if self.new_chat_on:
                self.store.set_tools_on(conversation_id, True)
            if self.new_chat_unticked:
                self.store.set_tools_unticked(conversation_id, self.new_chat_unticked)
            self.new_chat_on, self.new_chat_unticked = False, set()

    def _toggled(self, on: bool) -> None:
        cid = self.chats.conversation_id
        if cid is None:
            self.new_chat_on = on
        else:
            self.store.set_tools_on(cid, on)
        self._show()
        if on:
            self._count()

    def _opened(self, conversation_id: Optional[int]) -> None:
        if conversation_id is None:
            self.new_chat_on, self.new_chat_unticked = False, set()
        else:
            self._adopt(conversation_id)
        self._shown = conversation_id
        on = self.on_in(conversation_id)
        self.button.blockSignals(True)
        self.button.setChecked(on)
        self.button.blockSignals(False)
        self._show()
        if on:
            self._count()

    def _changed(self) -> None:
        """The servers, the settings, the model or the ticks changed: what the tools cost may have too."""
        if self.on_in(self.chats.conversation_id):
            self._count()
        self._show()

    def _servers_changed(self) -> None:
        self._changed()
        if self.menu.isVisible():  # a server's tools listed while the menu is open show in it
            self.menu.refresh()

    # -- which tools, in this chat ----------------------------------------------------------------------------------
    def unticked_in(self, conversation_id: Optional[int]) -> frozenset:
        """The tools not offered in this conversation (or in the new chat on screen)."""
        if conversation_id is None:
            return frozenset(self.new_chat_unticked)
        conv = self.store.conversation(conversation_id)
        return frozenset(conv.tools_unticked) if conv is not None else frozenset()

    def choices(self) -> list[ToolChoice]:
        """Every tool known now, ticked where the chat on screen offers it."""
        unticked = self.unticked_in(self.chats.conversation_id)
        return [
            ToolChoice(
                e.name,
                f"{e.server} · {e.tool}" if e.server else f"{e.name} (built-in)",
                e.description,
                e.name not in unticked,
            )
            for e in self.service.registry().entries
        ]

    def choice_notes(self) -> list[str]:
        """A line for each server whose tools are not listed (they are listed once a chat turns tools on)."""
        s = self.service
        if s.config_error:
            return ["mcp.json cannot be used (Settings → Tools)"]
        lines = []
        for name in s.names:
            state, _text = s.status(name)
            if state == READY:
                continue
            if state == FAILED:
                lines.append(f"{name}: could not start (Settings → Tools)")
            elif state == STARTING:
                lines.append(f"{name}: starting…")
            else:
                lines.append(f"{name}: its tools are listed once tools are on in a chat")
        return lines

    def set_ticked(self, name: str, ticked: bool) -> None:
        """Offer ``name`` in the chat on screen, or not."""
        cid = self.chats.conversation_id
        unticked = set(self.unticked_in(cid))
        if ticked:
            unticked.discard(name)
        else:
            unticked.add(name)
        self._set_unticked(cid, unticked)

    def tick_all(self) -> None:
        self._set_unticked(self.chats.conversation_id, set())

    def _set_unticked(self, conversation_id: Optional[int], unticked: set) -> None:
        if conversation_id is None:
            self.new_chat_unticked = unticked
        else:
            self.store.set_tools_unticked(conversation_id, unticked)
        self._changed()

    # -- what they cost ---------------------------------------------------------------------------------------------
    def _count(self) -> None:
        """List the servers first where they are not (on a thread), then count the definitions on the engine."""
        s = self.service
        if s.starting:
            return  # ``changed`` comes once they have started
        if not s.listed():
            s.list_in_background(retry=False)
            return
        registry = s.registry(self.unticked_in(self.chats.conversation_id))
        self.offered, self.available = registry.names, len(s.registry().names)
        definitions = registry.definitions()
        loaded = self.models.loaded
        key = (tuple(self.offered), getattr(loaded, "name", None), repr(definitions))
        if key == self._counted_for:
            return
        self._counted_for, self.tokens = key, None
        if self._counting is not None and not self._counting.done:
            self._counting.cancel()
        self._counting = None
        if definitions and loaded is not None:
            channel = self.bridge.run(tool_tokens_job(definitions), "the tools' size")
            channel.events.connect(lambda _e, ch=channel, k=key: self._counted(ch, k))
            self._counting = channel
        self._show()

    def _counted(self, channel, key) -> None:
        if not channel.done or key != self._counted_for:
            return
        try:
            self.tokens = channel.result()
        except TaskFailed:
            self.tokens = None
        self._counting = None
        self._show()

    def note_text(self) -> str:
        s = self.service
        if s.starting:
            return "tools: starting the MCP servers…"
        n = len(self.offered)
        if not n and self.available:
            return "tools: none ticked in this chat — tick them in the Tools button's menu (its arrow)"
        if not n:
            return "tools: none offered — turn on Redline's own or add MCP servers in Settings → Tools"
        text = f"tools: {n}" if n >= self.available else f"tools: {n} of {self.available}"
        if self.tokens is not None:
            text += f" · {self.tokens:,} tokens"
        elif self._counting is not None:
            text += " · counting tokens…"
        elif self.models.loaded is None:
            text += " · tokens counted once a model is loaded"
        failed = len(s.errors)
        if failed:
            text += f" · {failed} server{'s' if failed > 1 else ''} could not start (Settings → Tools)"
        return text

    def _show(self) -> None:
        on = self.on_in(self.chats.conversation_id)
        self.note.setVisible(on)
        if on:
            self.note.setText(self.note_text())
            self.note.setToolTip(
                "Offered in this chat, at the start of every prompt: " + (", ".join(self.offered) or "none")
            )
        self.button.setToolTip(
            (
                "Tools are on in this chat: the model may call them, each call asked about (click to turn off; "
                "the arrow chooses which tools this chat offers)"
            )
            if on
            else "Let the model call tools in this chat (MCP servers and Redline's own: Settings → Tools; the arrow "
            "chooses which)"
        )

    # -- replies with tools -----------------------------------------------------------------------------------------
    def configure(self, conversation_id: Optional[int], config):
        """``config`` for the next reply in ``conversation_id``: with this controller as its ``tools`` when tools are
        on there."""
        if conversation_id is None or not self.on_in(conversation_id):
            return config
        return dataclasses.replace(config, tools=self)

    def start(self, reply, messages: list[dict], request) -> ToolRun:
        """Run the reply through the tool loop (``ChatSession``'s call): its channel."""
        rounds = int(getattr(self.settings.value, "tools_max_rounds", 8))
        unticked = self.unticked_in(reply.conversation_id)
        # What was counted is of the chat on screen's ticks: kept with this reply only if its chat offers the same.
        counted = self._counted_for is not None and self._counted_for[0] == tuple(self.service.registry(unticked).names)
        tokens = self.tokens if counted else None
        run = ToolRun(
            self.service, self.bridge.service, messages, request, rounds, tokens, unticked=unticked, parent=self
        )
        mid = reply.message_id
        run.calls_changed.connect(lambda calls, r=run, m=mid, c=reply.conversation_id: self._calls(m, c, r, calls))
        run.events.connect(lambda _e, r=run, m=mid: self._ended(m, r))
        self.runs[mid] = run
        self._sync.start()
        return run.start()

    def _calls(self, message_id: int, conversation_id: int, run: ToolRun, calls: list) -> None:
        self._show_calls(message_id, run, calls)
        asking = any(c.get("state") == "asking" for c in calls)
        if asking and not self.chats.showing(conversation_id):
            self.banner.show_message(WAITING_ELSEWHERE, "info")

    def _show_calls(self, message_id: int, run: ToolRun, calls: list) -> None:
        widget = self.view.widget_for(message_id)
        if widget is None or run.done or not widget.streaming:
            return
        ToolCallsPanel.of(widget).set_calls(calls, run.answer)
        states = {c.get("state") for c in calls}
        # The reply's badge says what it waits for (else "generating…").
        waiting = "waiting for your answer" if "asking" in states else "running a tool…" if "running" in states else ""
        if widget.waiting != waiting:
            widget.set_waiting(waiting)

    def _ended(self, message_id: int, run: ToolRun) -> None:
        if run.done and self.runs.get(message_id) is run:
            del self.runs[message_id]
            if not self.runs:
                self._sync.stop()
            # Gone once its session has kept what it needs (in this same turn) and its thread has ended; a thread
            # still waiting for a hung call keeps it until then.
            QTimer.singleShot(0, self, lambda r=run: self._release(r))

    def _release(self, run: ToolRun) -> None:
        if run.thread is not None and run.thread.is_alive():
            QTimer.singleShot(1_000, self, lambda r=run: self._release(r))
            return
        run.deleteLater()

    def _sync_panels(self) -> None:
        """A reply's widget built again (its chat opened again, scrolled back into view) gets its live calls."""
        for mid, run in list(self.runs.items()):
            self._show_calls(mid, run, run.snapshot())

    def waiting_call(self) -> Optional[tuple[ToolRun, str]]:
        """A run and the id of its call waiting for the user's word, if one is."""
        for run in self.runs.values():
            if run.waiting_for is not None:
                return run, run.waiting_for
        return None

    # -- closing ------------------------------------------------------------------------------------------------------
    def shutdown(self) -> bool:
        """The window closes: every loop is stopped (a call waiting for the user is denied) and every server stopped,
        waiting a few seconds at most. True if they stopped in time."""
        for run in list(self.runs.values()):
            run.cancel()
        self._sync.stop()
        return self.service.close()
