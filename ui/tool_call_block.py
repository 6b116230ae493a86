"""A reply's tool calls in the chat: each call a block headed "Tool call: NAME" with a toggle, its arguments as
pretty-printed JSON beneath (folded when they are long), and what Copy puts on the clipboard for them."""

from __future__ import annotations

import json
from typing import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QToolButton, QVBoxLayout

from ..inference import ToolCall
from .markdown import render

# A call's arguments are shown open: they are what the model asked for, usually a line or two, and a reply that is
# a call says nothing else. Longer than this (a file's contents, a long query), they start folded, so that one call
# does not push the conversation off the screen; the header's toggle opens them.
FOLDED_LINES = 20


def pretty_arguments(call: ToolCall) -> str:
    """A call's arguments as indented JSON (they parsed as a JSON object, or it would not be a call)."""
    return json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)


def calls_json(calls: Sequence[ToolCall]) -> str:
    """What Copy puts on the clipboard for a reply's calls: one call's ``{"name", "arguments"}`` object, or a list
    of them, as indented JSON."""
    objs = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
    return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2, ensure_ascii=False)


class ToolCallBlock(QFrame):
    """One tool call in a reply: a header "Tool call: NAME" that folds and unfolds its arguments beneath."""

    def __init__(self, call: ToolCall, browser: type, parent=None):
        """``browser``: the view's read-only text class (chat_view.MessageBrowser), for the arguments."""
        super().__init__(parent)
        self.call = call
        self.setObjectName("toolCall")
        self.setFrameShape(QFrame.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 4)
        layout.setSpacing(0)
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("toolCallHeader")
        self.toggle.setText(f"Tool call: {call.name}")
        self.toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.toggle.setAutoRaise(True)
        self.toggle.setCheckable(True)
        # Open or folded, the header reads as a heading with an arrow, not as a button held down.
        self.toggle.setStyleSheet("QToolButton { border: none; background: transparent; font-weight: bold; }")
        self.toggle.toggled.connect(self._show_arguments)
        layout.addWidget(self.toggle)
        self.arguments = browser(self)
        self.arguments.setObjectName("toolCallArguments")
        self.arguments_text = pretty_arguments(call)
        render(self.arguments.document(), "```json\n" + self.arguments_text + "\n```")
        layout.addWidget(self.arguments)
        expanded = self.arguments_text.count("\n") + 1 <= FOLDED_LINES
        self.toggle.setChecked(expanded)
        self._show_arguments(expanded)

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def _show_arguments(self, shown: bool) -> None:
        self.toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.toggle.setToolTip(("Hide" if shown else "Show") + " this call's arguments")
        self.arguments.setVisible(shown)
        if shown:
            self.arguments._fit()
