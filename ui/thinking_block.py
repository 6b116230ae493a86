"""A reasoning model's thinking, above its answer: a block whose header says how long it thought ("Thought for 12.4 s ·
412 tokens", from the engine's figures; "Thinking… 3.1 s" while it streams) and folds the thinking away beneath.

It is open while the model thinks and folds itself when the answer begins (unless the user opened or closed it
meanwhile: their choice stays); a stored reply opens folded. A message without thinking shows no block. The answer is
the message's own text, so copying the reply copies the answer alone."""

from __future__ import annotations

import time
from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QToolButton, QVBoxLayout

SHOWN_CHARS = 100_000  # of a very long thinking, the start is shown (the store keeps it all)
LIVE_CHARS = 4_000  # while it streams, its last characters: laying out all of it ten times a second would stall


def thought_line(stats: dict, live_s: Optional[float] = None) -> str:
    """The block's header: "Thought for 12.4 s · 412 tokens" from a finished reply's figures (the time from its
    start to its last thinking token), "Thinking… 3.1 s" while it thinks (``live_s``)."""
    if live_s is not None:
        return f"Thinking… {live_s:.1f} s"
    bits = []
    if stats.get("thinking_ms") is not None:
        bits.append(f"Thought for {stats['thinking_ms'] / 1000:.1f} s")
    if stats.get("reasoning_tokens"):
        bits.append(f"{stats['reasoning_tokens']:,} tokens")
    if stats.get("thinking_tokens_per_s"):
        bits.append(f"{stats['thinking_tokens_per_s']:.1f} tok/s")
    return " · ".join(bits) if bits else "Thoughts"


class ThinkingBlock(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        self.setFrameShape(QFrame.StyledPanel)
        self.text = ""
        self._started: Optional[float] = None  # when the thinking began to stream here (the live header's clock)
        self._user_choice = False  # the user opened or folded it: an automatic fold no longer applies
        self._folded_for_answer = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 4)
        layout.setSpacing(0)
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("thinkingHeader")
        self.toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.toggle.setAutoRaise(True)
        self.toggle.setCheckable(True)
        self.toggle.setStyleSheet("QToolButton { border: none; background: transparent; font-style: italic; }")
        self.toggle.clicked.connect(self._clicked)
        self.toggle.toggled.connect(self._show)
        layout.addWidget(self.toggle)
        self.body = QLabel(self)
        self.body.setObjectName("thinkingText")
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.PlainText)  # model output: never rich text
        self.body.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.body.setStyleSheet("QLabel { color: palette(placeholder-text); }")
        layout.addWidget(self.body)
        self._show(False)
        self.setVisible(False)

    @classmethod
    def attach(cls, message, layout) -> "ThinkingBlock":
        """A block for ``message`` (a MessageWidget), added to its ``layout`` where the answer follows."""
        block = cls(message)
        layout.addWidget(block)
        return block

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_text(self, text: str) -> None:
        """The thinking so far (a growing reply's, or a stored one's); its message re-renders at the next tick."""
        if (text or "") == self.text:
            return
        self.text = text or ""
        message = self.parentWidget()
        if hasattr(message, "mark_dirty"):
            message.mark_dirty()

    def _clicked(self) -> None:
        self._user_choice = True

    def _show(self, shown: bool) -> None:
        self.toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.toggle.setToolTip(("Hide" if shown else "Show") + " the model's thinking")
        self.body.setVisible(shown)

    def render(self, stats: dict, streaming: bool, answered: bool) -> None:
        """Show the thinking as it is now: ``streaming`` (the reply is being written) and ``answered`` (its answer
        has begun) decide the header and whether it folds."""
        self.setVisible(bool(self.text))
        if not self.text:
            return
        thinking_now = streaming and not answered
        if thinking_now and self._started is None:
            self._started = time.monotonic()
            if not self._user_choice:
                self.toggle.setChecked(True)  # open while it thinks
        if answered and not self._folded_for_answer:
            self._folded_for_answer = True
            if not self._user_choice:
                self.toggle.setChecked(False)  # the answer begins: the thinking folds away
        live = time.monotonic() - self._started if thinking_now and self._started is not None else None
        self.toggle.setText(thought_line(stats or {}, live))
        if thinking_now and len(self.text) > LIVE_CHARS:
            shown = "… " + self.text[-LIVE_CHARS:]
        else:
            shown = self.text if len(self.text) <= SHOWN_CHARS else self.text[:SHOWN_CHARS] + " …"
        if self.body.text() != shown:
            self.body.setText(shown)
