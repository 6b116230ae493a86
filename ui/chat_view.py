"""The chat transcript: one widget per message, Markdown-rendered, with per-message actions.

A streaming reply only marks its widget dirty; a timer re-renders dirty
widgets every ``RENDER_INTERVAL_MS``, so a fast model costs at most one render
per interval however many tokens arrive, and never re-renders earlier messages.

A long conversation is shown through a window of at most ``MAX_BUILT`` message
widgets: it opens with its last ``PAGE`` messages; scrolling near the top (or the
"Show earlier messages" button) builds older ones a couple per event-loop turn
and drops the newest beyond the window, and scrolling back down does the
reverse, keeping what is on screen in place. Opening a 500-message conversation
costs one page, and scrolling through it never lays out more than the window.

An assistant reply that is tool calls (``read_calls``: the server's own parsers, every family's syntax) shows its
text before the calls as Markdown and each call as a block: "Tool call: NAME" with a toggle, its arguments as
pretty-printed JSON beneath. A call that does not parse stays the text it was.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Optional, Sequence

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..inference import ToolCall, read_calls
from .attachment_widgets import AttachedFiles
from .chat_empty import ExamplePrompts
from .citations import Citations
from .markdown import SafeDocument, append_reply, code_blocks, hard_line_breaks, render
from .signals import emit
from .style import READING_WIDTH, current_theme, set_icon, space_lines
from .thinking_block import ThinkingBlock
from .tool_call_block import FOLDED_LINES, ToolCallBlock, calls_json, pretty_arguments  # noqa: F401 - re-exported
from .tools.calls_view import ToolCallsPanel

RENDER_INTERVAL_MS = 100
PAGE = 12  # message widgets built when a conversation opens (fills a tall window)
SCROLL_CHUNK = 1  # built per event-loop turn while scrolling (two per turn reached 45-51 ms stalls here; one, 29-37)
LOAD_MARGIN_PX = 600  # keep building messages while the view is this close to the top (or bottom)
MAX_BUILT = 48  # message widgets alive at once: layout cost stays flat however long the conversation


def format_stats(stats: dict) -> str:
    """One line under an assistant message: measured figures only, each labelled."""
    if not stats:
        return ""
    bits = []
    if stats.get("new_tokens") is not None:
        bits.append(f"{stats['new_tokens']} tokens")
    if stats.get("tokens_per_s"):
        bits.append(f"{stats['tokens_per_s']:.1f} tok/s")
    waited = waited_text(stats)
    if waited:
        bits.append(waited)
    if stats.get("ttft_ms") is not None:
        bits.append(f"TTFT {stats['ttft_ms']:.0f} ms")
    if stats.get("cached_tokens") and stats.get("prompt_tokens"):  # the prompt's start was not read again
        bits.append(f"{stats['cached_tokens']:,} of {stats['prompt_tokens']:,} prompt tokens from the cache")
    if stats.get("strategy") == "remote":  # the server decoded it its own way: said once, not "remote · server"
        bits.append("on the server")
    else:
        bits.extend(str(stats[key]) for key in ("strategy", "precision", "device") if stats.get(key))
    if stats.get("acceptance_rate") is not None:
        bits.append(
            f"draft accepted {stats['acceptance_rate'] * 100:.0f}% "
            f"({stats.get('draft_accepted', 0)}/{stats.get('draft_proposed', 0)})"
        )
    reason = stats.get("finish_reason")
    if reason == "cancelled":
        bits.append("stopped")
    elif reason == "length":
        bits.append("hit max new tokens")
    elif reason == "error":
        bits.append("error")
    elif reason == "interrupted":
        bits.append("interrupted")
    return " · ".join(bits)


WAIT_SHOWN_MS = 100  # a shorter wait (a tokenizer's turn, a thread's wake-up) is not worth a word


def waited_text(stats: dict) -> str:
    """ "waited 30 s for a chat reply": the reply's wait before its own work began, kept apart from its TTFT (which
    counts from there); "" for a wait too short to say."""
    ms = stats.get("queued_ms")
    if ms is None or ms < WAIT_SHOWN_MS:
        return ""
    s = ms / 1000
    took = f"{s:.1f} s" if s < 10 else f"{s:.0f} s" if s < 120 else f"{int(s // 60)} min {s % 60:.0f} s"
    what = stats.get("waited_for")
    return f"waited {took} for {what}" if what else f"waited {took}"


def reply_notes(stats: dict) -> list[str]:
    """What a stored reply's notes say (why it stopped, what was left out), as shown under it."""
    return [str(n) for n in (stats or {}).get("notes") or [] if str(n).strip()]


def confirm_open_link(parent, address: str) -> bool:
    """Ask before opening a link from a message (tests replace this)."""

    answer = QMessageBox.question(
        parent,
        "Open link?",
        f"Open this address in your browser?\n\n{address}",
        QMessageBox.Open | QMessageBox.Cancel,
        QMessageBox.Cancel,
    )
    return answer == QMessageBox.Open


SHOWN_CHARS = 50_000  # longest message text typeset in the view
COPY_TIP = "Copy this message as Markdown"


class MessageBrowser(QTextBrowser):
    """A read-only rich-text view that is exactly as tall as its content."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setDocument(SafeDocument(self))
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._open_link)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.NoFrame)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard | Qt.LinksAccessibleByMouse)
        self.document().documentLayout().documentSizeChanged.connect(lambda _s: self._fit())

    def loadResource(self, kind, url):  # noqa: N802 - Qt override: never fetch anything for model output
        return None

    def _open_link(self, url: QUrl) -> None:
        # Only the user's click opens a link, only a web link, and only after showing where it goes:
        # model output is untrusted and link text can hide the real address.
        if url.scheme() not in ("http", "https"):
            return
        if confirm_open_link(self, url.toString()):
            QDesktopServices.openUrl(url)

    def _fit(self) -> None:
        self.document().setTextWidth(self.viewport().width())
        height = int(self.document().size().height()) + 4
        if height != self.height():
            self.setFixedHeight(height)

    def resizeEvent(self, event):  # noqa: N802
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(400, int(self.document().size().height()) + 4)


class MessageWidget(QFrame):
    regenerate_requested = Signal(int)
    edit_requested = Signal(int)

    def __init__(
        self,
        message_id: Optional[int],
        role: str,
        text: str = "",
        stats: Optional[dict] = None,
        partial: bool = False,
        parent=None,
    ):
        super().__init__(parent)
        self.message_id = message_id
        self.role = role
        self.text = text
        self.stats = dict(stats or {})
        self.partial = partial
        self.streaming = False
        self.waiting = ""  # while a reply waits for the engine: why
        self.draft_spans: list[list[int]] = [list(s) for s in self.stats.get("draft_spans", [])]
        self._dirty = True
        self.render_count = 0  # how often this message was rendered (streaming must touch only the last)
        self.position: int = 0  # its place in the conversation (set by the view)
        self.attached = None  # a user's message's documents and images, under its header (ui/attachment_widgets.py)
        self.setObjectName("userMessage" if role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.StyledPanel)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        header = QHBoxLayout()
        self.role_label = QLabel("You" if role == "user" else "Assistant")
        self.role_label.setObjectName("roleLabel")
        header.addWidget(self.role_label)
        self.badge = QLabel()
        self.badge.setObjectName("partialBadge")
        header.addWidget(self.badge)
        header.addStretch(1)
        self.copy_button = self._tool("Copy", COPY_TIP, self.copy_text, "copy")
        self.copy_code_button = self._tool("Copy code", "Copy a code block from this message", self.copy_code, "code")
        if role == "assistant":
            act = ("Regenerate", "Generate this reply again", self.regenerate_requested, "regenerate")
        else:
            act = ("Edit", "Edit this message and send it again", self.edit_requested, "edit")
        self.action_button = self._tool(*act[:2], lambda: emit(act[2], self.message_id or -1), act[3])
        # The actions are icons shown while the pointer is over the message; their place is kept meanwhile, so
        # nothing moves as they come and go (the window's Copy and Regenerate keys act on the last reply).
        self.actions = QWidget(self)
        row = QHBoxLayout(self.actions)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        for b in (self.copy_button, self.copy_code_button, self.action_button):
            row.addWidget(b)
        policy = self.actions.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.actions.setSizePolicy(policy)
        self.actions.hide()
        header.addWidget(self.actions)
        layout.addLayout(header)
        self.thinking = ThinkingBlock.attach(self, layout)  # a reasoning model's thinking, above its answer
        self.browser = MessageBrowser(self)
        layout.addWidget(self.browser)
        self.calls: list[ToolCall] = []  # the reply's tool calls, shown as blocks under its text
        self.call_blocks: list[ToolCallBlock] = []
        self._calls_box = QVBoxLayout()
        self._calls_box.setSpacing(4)
        layout.addLayout(self._calls_box)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("statsLabel")
        self.stats_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.stats_label.setWordWrap(True)
        layout.addWidget(self.stats_label)
        self.render()

    def _tool(self, text, tip, slot, icon) -> QToolButton:
        b = QToolButton(self)
        b.setObjectName("messageAction")
        b.setText(text)  # what a screen reader says; the button shows its icon
        b.setToolTip(tip)
        b.setToolButtonStyle(Qt.ToolButtonIconOnly)
        b.setIconSize(QSize(16, 16))
        set_icon(b, icon)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def changeEvent(self, event):  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange and getattr(self, "_theme", None) not in (None, current_theme().name):
            self._dirty = True

    def enterEvent(self, event):  # noqa: N802 - Qt override
        self.actions.show()
        super().enterEvent(event)

    def leaveEvent(self, event):  # noqa: N802 - Qt override
        self.actions.hide()
        super().leaveEvent(event)

    # -- content --------------------------------------------------------------------
    def append(self, delta: str, from_draft: bool = False) -> None:
        self.text = append_reply(self.text, self.draft_spans, delta, from_draft)
        self._dirty = True

    def set_content(self, text: str, stats: Optional[dict] = None, partial: Optional[bool] = None) -> None:
        self.text = text
        if stats is not None:
            self.stats = dict(stats)
            self.draft_spans = [list(s) for s in self.stats.get("draft_spans", self.draft_spans)]
        if partial is not None:
            self.partial = partial
        self._dirty = True

    def dirty(self) -> bool:
        return self._dirty

    def mark_dirty(self) -> None:
        """Its text changed (a growing reply): the view re-renders it at its next tick."""
        self._dirty = True

    def set_waiting(self, why: str) -> None:
        """A reply the engine has not started yet says why it waits ("waiting for the speed lab")."""
        self.waiting = why
        self.badge.setText(why or ("generating…" if self.streaming else self.badge.text()))

    def render(self) -> None:
        self._dirty = False
        self.render_count += 1
        notes = reply_notes(self.stats) if self.role == "assistant" else []
        before, calls = read_calls(self.text) if self.role == "assistant" else (self.text, [])
        self._show_calls(calls)
        ToolCallsPanel.show_in(self, self.stats)  # its calls through the tool loop, above its answer (ui/tools/)
        self.thinking.render(self.stats, self.streaming, bool(self.text))
        shown = before if before or calls or not self.streaming else "…"
        if not self.text and not self.streaming and notes:  # a reply that never got a word: the line saying why
            shown = "*" + " ".join(n.replace("*", "\\*") for n in notes) + "*"
            notes = []
        if len(shown) > SHOWN_CHARS:  # typesetting megabytes would freeze the window; the store keeps it all
            shown = (
                shown[:SHOWN_CHARS] + f"\n\n*… {len(shown) - SHOWN_CHARS:,} more characters not shown "
                "(the whole message is saved and exported).*"
            )
        render(self.browser.document(), hard_line_breaks(shown) if self.role == "user" else shown, self.draft_spans)
        space_lines(self.browser.document())
        self._theme = current_theme().name  # code and draft colours are the theme's: drawn again when it changes
        self.browser.setVisible(bool(shown) or not calls)  # a reply that is only calls: the blocks, no empty line
        self.browser._fit()
        line = format_stats(self.stats)
        if notes:
            line = (line + "\n" if line else "") + " ".join(notes)
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))
        Citations.show_under(self, self.stats)  # a long document's excerpts the reply was given, to click
        if self.streaming:
            self.badge.setText(self.waiting or "generating…")
        elif self.partial:
            self.badge.setText("partial")
        else:
            self.badge.setText("")
        self.copy_code_button.setVisible(bool(code_blocks(self.browser.document())))
        self.action_button.setEnabled(not self.streaming and self.message_id is not None)

    def _show_calls(self, calls: list[ToolCall]) -> None:
        """Build the calls' blocks when the calls changed (a streamed reply re-renders often: a block the user
        folded stays folded while the rest of the reply comes)."""
        if [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in self.calls]:
            return
        for block in self.call_blocks:
            block.setParent(None)
            block.deleteLater()
        self.calls = calls
        self.call_blocks = [ToolCallBlock(c, MessageBrowser, self) for c in calls]
        for block in self.call_blocks:
            self._calls_box.addWidget(block)
            block.show()  # a child added to a shown widget is not shown by itself
        tip = "Copy this message: its text as Markdown, its tool calls as JSON" if calls else COPY_TIP
        self.copy_button.setToolTip(tip)

    # -- actions --------------------------------------------------------------------
    def copy_text(self) -> None:
        """The message as Markdown; a reply's tool calls as JSON (after its text, if it has any)."""
        if self.calls:
            before = read_calls(self.text)[0]
            QGuiApplication.clipboard().setText((before + "\n\n" if before else "") + calls_json(self.calls))
            return
        QGuiApplication.clipboard().setText(self.text)

    def copy_code(self) -> None:
        blocks = code_blocks(self.browser.document())
        if len(blocks) == 1:
            QGuiApplication.clipboard().setText(blocks[0][1])
            return
        menu = QMenu(self)
        for i, (lang, code) in enumerate(blocks, 1):
            first = code.strip().splitlines()[0][:40] if code.strip() else ""
            menu.addAction(
                f"Block {i}{' (' + lang + ')' if lang else ''}: {first}",
                lambda c=code: QGuiApplication.clipboard().setText(c),
            )
        menu.exec(self.copy_code_button.mapToGlobal(self.copy_code_button.rect().bottomLeft()))


Loader = Callable[[Optional[int], Optional[int], int], list]  # (before, after, limit) -> messages, oldest first


class ChatView(QScrollArea):
    """The transcript of one conversation, built a window at a time."""

    regenerate_requested = Signal(int)
    edit_requested = Signal(int)
    example_chosen = Signal(str)  # an example prompt of the empty chat was clicked

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setFrameShape(QFrame.NoFrame)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._inner = QWidget()
        self._inner.setObjectName("chatInner")
        self._layout = QVBoxLayout(self._inner)
        self._layout.setContentsMargins(12, 12, 12, 12)
        self._layout.setSpacing(10)
        self.earlier_button = QPushButton()
        self.earlier_button.setObjectName("earlierButton")
        self.earlier_button.setFlat(True)
        self.earlier_button.clicked.connect(lambda: self.load_earlier())
        self.earlier_button.hide()
        self._layout.addWidget(self.earlier_button)
        self.placeholder = QLabel()
        self.placeholder.setObjectName("chatPlaceholder")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self._layout.addWidget(self.placeholder)
        self.examples = ExamplePrompts()
        self.examples.chosen.connect(self.example_chosen)
        self._examples_on = False
        self._layout.addWidget(self.examples)
        self._first_message_index = self._layout.count()  # message widgets start here
        self.later_button = QPushButton("Jump to the latest messages")
        self.later_button.setObjectName("laterButton")
        self.later_button.setFlat(True)
        self.later_button.clicked.connect(self.jump_to_latest)
        self.later_button.hide()
        self._layout.addWidget(self.later_button)
        self._layout.addStretch(1)
        self.setWidget(self._inner)
        self.widgets: list[MessageWidget] = []
        self._loader: Optional[Loader] = None
        self._earlier = 0  # messages older than the first widget, not built
        self._later = 0  # messages newer than the last widget, not built (only after scrolling far up)
        self._anchor: Optional[tuple[MessageWidget, int]] = None  # keep this widget at this offset on screen
        self._setting_scroll = False
        self._load_pending = False
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)
        self._timer = QTimer(self)
        self._timer.setInterval(RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self.render_dirty)
        self._timer.start()
        self.set_placeholder("")

    def set_placeholder(self, text: str) -> None:
        self.placeholder.setText(text)
        self._show_empty()

    def show_examples(self, on: bool) -> None:
        """The example prompts under the empty chat's line (while a model is loaded)."""
        self._examples_on = on
        self._show_empty()

    def _show_empty(self) -> None:
        empty = not self.widgets
        self.placeholder.setVisible(bool(self.placeholder.text()) and empty)
        self.examples.setVisible(self._examples_on and empty)

    def resizeEvent(self, event):  # noqa: N802 - Qt override
        # One reading column, centred: at most READING_WIDTH wide, whatever the window's width.
        side = max(12, (self.viewport().width() - READING_WIDTH) // 2)
        self._layout.setContentsMargins(side, 16, side, 16)
        super().resizeEvent(event)

    def _drop(self, widgets: list[MessageWidget]) -> None:
        for w in widgets:
            w.setParent(None)
            w.deleteLater()

    def clear(self) -> None:
        self._drop(self.widgets)
        self.widgets = []
        self._loader = None
        self._earlier = self._later = 0
        self._anchor = None
        self._follow = True
        self._update_buttons()
        self._show_empty()

    def show_messages(self, messages: Sequence, earlier: int = 0, loader: Optional[Loader] = None) -> None:
        """Show ``messages`` (the newest page); ``earlier`` older ones are fetched through ``loader`` on demand.
        Messages need id, role, content, stats, partial and position."""
        self.clear()
        for m in messages:
            self._append(self._make(m))
        self._loader = loader
        self._earlier = earlier
        self._update_buttons()
        self._show_empty()

    def _update_buttons(self) -> None:
        self.earlier_button.setVisible(self._earlier > 0)
        self.earlier_button.setText(f"Show earlier messages ({self._earlier})")
        self.later_button.setVisible(self._later > 0)

    def _set_anchor(self) -> None:
        """Remember where the first widget on screen is, so building or dropping others does not move it."""
        value = self.verticalScrollBar().value()
        ref = next((w for w in self.widgets if w.y() + w.height() > value), None)
        self._anchor = (ref, ref.y() - value) if ref is not None else None
        self._follow = False

    def load_earlier(self, count: int = PAGE) -> int:
        """Build ``count`` messages before the first built one; keep the view where it is. Returns how many."""
        if self._earlier <= 0 or self._loader is None or not self.widgets:
            return 0
        older = self._loader(self.widgets[0].position, None, count)
        if not older:
            self._earlier = 0
            self._update_buttons()
            return 0
        self._set_anchor()
        built = [self._make(m) for m in older]
        for i, w in enumerate(built):
            self._layout.insertWidget(self._first_message_index + i, w)
        self.widgets[:0] = built
        self._earlier = max(0, self._earlier - len(older))
        extra = len(self.widgets) - MAX_BUILT
        if extra > 0:  # drop the newest beyond the window; they are rebuilt when scrolled back to
            self._drop(self.widgets[-extra:])
            del self.widgets[-extra:]
            self._later += extra
        self._update_buttons()
        return len(older)

    def load_later(self, count: int = PAGE) -> int:
        """Build ``count`` messages after the last built one (after scrolling far up and back down)."""
        if self._later <= 0 or self._loader is None or not self.widgets:
            return 0
        newer = self._loader(None, self.widgets[-1].position, count)
        if not newer:
            self._later = 0
            self._update_buttons()
            return 0
        self._set_anchor()
        for m in newer:
            self._append(self._make(m))
        self._later = max(0, self._later - len(newer))
        extra = len(self.widgets) - MAX_BUILT
        if extra > 0:
            if self._anchor is not None and self._anchor[0] in self.widgets[:extra]:
                self._anchor = (self.widgets[extra], self._anchor[1] + self.widgets[extra].y() - self._anchor[0].y())
            self._drop(self.widgets[:extra])
            del self.widgets[:extra]
            self._earlier += extra
        self._update_buttons()
        return len(newer)

    def jump_to_latest(self) -> None:
        """Show the newest page again, following the bottom."""
        if self._loader is None:
            return
        loader = self._loader
        newest = loader(None, None, PAGE)
        total = self._earlier + len(self.widgets) + self._later
        self.show_messages(newest, max(0, total - len(newest)), loader)

    def _make(self, m) -> MessageWidget:
        w = MessageWidget(m.id, m.role, m.content, m.stats, m.partial)
        w.thinking.set_text(getattr(m, "reasoning", ""))
        AttachedFiles.attach(w, getattr(m, "attachments", None))  # a document's line, an image's thumbnail
        w.position = m.position
        w.regenerate_requested.connect(self.regenerate_requested)
        w.edit_requested.connect(self.edit_requested)
        return w

    def _append(self, w: MessageWidget) -> None:
        self._layout.insertWidget(self._layout.count() - 2, w)  # before the "latest" button and the stretch
        self.widgets.append(w)

    def add_message(
        self, message_id, role, text="", stats=None, partial=False, position=None, attachments=()
    ) -> MessageWidget:
        """A new message at the end of the conversation (sent, or a reply starting): the view follows it."""
        if self._later > 0:
            self.jump_to_latest()  # the tail is not built: show it (the new message is already stored)
            existing = self.widget_for(message_id)
            if existing is not None:
                self._follow = True
                return existing
        if position is None:
            position = self.widgets[-1].position + 1 if self.widgets else 0
        m = SimpleNamespace(id=message_id, role=role, content=text, stats=stats, partial=partial, position=position)
        m.attachments = attachments
        w = self._make(m)
        self._append(w)
        self._show_empty()
        self._follow = True
        self._anchor = None
        return w

    def remove_from(self, message_id: int) -> None:
        """Drop a message's widget and every later one (regenerate, edit-and-resend)."""
        for i, w in enumerate(self.widgets):
            if w.message_id == message_id:
                self._drop(self.widgets[i:])
                del self.widgets[i:]
                self._later = 0  # the store deleted those too
                break
        self._update_buttons()
        self._show_empty()

    def showing_latest(self) -> bool:
        """Is the end of the conversation built (not scrolled far up)?"""
        return self._later == 0

    def widget_for(self, message_id: int) -> Optional[MessageWidget]:
        return next((w for w in self.widgets if w.message_id == message_id), None)

    def render_dirty(self) -> None:
        for w in self.widgets:
            if w.dirty():
                w.render()

    def _on_range(self, _lo, hi) -> None:
        self._setting_scroll = True
        try:
            if self._follow:
                self.verticalScrollBar().setValue(hi)
            elif self._anchor is not None and self._anchor[0] in self.widgets:
                # Messages were built or dropped around the one on screen: keep it where it was.
                ref, offset = self._anchor
                self.verticalScrollBar().setValue(ref.y() - offset)
        finally:
            self._setting_scroll = False

    def _on_scroll(self, value) -> None:
        bar = self.verticalScrollBar()
        if self._setting_scroll:
            return
        self._anchor = None
        # Follow the reply only while the user is at the bottom; scrolling up to read stops following.
        self._follow = value >= bar.maximum() - 8 and self._later == 0
        if not self._load_pending and bar.maximum() > 0 and self._wants_more():
            self._load_pending = True
            QTimer.singleShot(0, self._load_more)  # not inside the scroll bar's own signal

    def _wants_more(self) -> bool:
        bar = self.verticalScrollBar()
        return (self._earlier > 0 and bar.value() < LOAD_MARGIN_PX) or (
            self._later > 0 and bar.value() > bar.maximum() - LOAD_MARGIN_PX
        )

    def _load_more(self) -> None:
        self._load_pending = False
        bar = self.verticalScrollBar()
        if self._earlier > 0 and bar.value() < LOAD_MARGIN_PX:
            self.load_earlier(SCROLL_CHUNK)
        elif self._later > 0 and bar.value() > bar.maximum() - LOAD_MARGIN_PX:
            self.load_later(SCROLL_CHUNK)
        else:
            return
        # A few messages per turn, so the wheel and the timers keep running in between; go on in the next
        # turn while the view is still near the edge.
        self._load_pending = True
        QTimer.singleShot(0, self._load_more)
