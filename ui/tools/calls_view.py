"""A reply's calls through the tool loop, above its answer in the transcript: a block per call (the chat's
``ToolCallBlock``: "Tool call: echo · add", its arguments as JSON), and beneath it

- while the call waits for the user: "Allow echo · add?" with **Allow once**, **Always allow** and **Deny**;
- what became of it: "allowed once · 12 ms", "denied — the model was told so", "stopped";
- its result, folded: a header with its first line ("Result: 5", an error in the error style) that opens the first
  2,000 characters beneath.

The calls are the reply's stats (``tool_calls``, kept in the store), so a reopened conversation shows them again;
while a reply runs, the window's tools controller hands the panel the live calls and where the user's answer goes."""

from __future__ import annotations

import json
from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

from ...inference import ToolCall
from ..tool_call_block import ToolCallBlock

PREVIEW_CHARS = 60  # of a result's first line, in its folded header
Answer = Callable[[str, str], None]  # (call id, "yes" | "always" | "no")


def where(call: dict) -> str:
    """ "echo · add" for a server's tool, "calculate" for a built-in."""
    return f"{call['server']} · {call.get('tool') or call['name']}" if call.get("server") else call["name"]


def status_line(call: dict) -> str:
    state, approval, ms = call.get("state"), call.get("approval") or "", call.get("ms") or 0
    if state == "running":
        return f"{approval} · running…" if approval else "running…"
    if state in ("done", "error"):
        took = f"{ms:,.0f} ms" if ms >= 1 else "under 1 ms"
        return f"{approval} · {took}" if approval else took
    if state == "denied":
        return f"{approval or 'denied'} — the model was told so"
    if state == "stopped":
        return "stopped"
    if state == "not run":
        return "not run"
    return ""


class ToolCallView(ToolCallBlock):
    """One call: its block, the question while it waits, its status and its folded result."""

    def __init__(self, call: dict, browser: type, answer: Optional[Answer], parent=None):
        super().__init__(ToolCall(call["name"], json.dumps(call.get("arguments"), ensure_ascii=False)), browser, parent)
        self.call: dict = {}
        self.answer_to = answer
        self.toggle.setText(f"Tool call: {where(call)}")
        layout = self.layout()
        self.approval = QFrame(self)
        self.approval.setObjectName("toolApproval")
        row = QHBoxLayout(self.approval)
        row.setContentsMargins(8, 4, 4, 4)
        self.question = QLabel(f"Allow {where(call)}?")
        self.question.setObjectName("toolApprovalQuestion")
        self.question.setWordWrap(True)
        row.addWidget(self.question, 1)
        self.allow_once = self._button("Allow once", "Run this call, and ask again next time", "yes")
        self.allow_always = self._button(
            "Always allow", "Run this call and every later call of this tool without asking (saved)", "always"
        )
        self.deny = self._button("Deny", "Do not run it; the model is told you did not allow it", "no")
        for b in (self.allow_once, self.allow_always, self.deny):
            row.addWidget(b)
        layout.addWidget(self.approval)
        self.status = QLabel()
        self.status.setObjectName("toolCallStatus")
        layout.addWidget(self.status)
        self.result_toggle = QToolButton(self)
        self.result_toggle.setObjectName("toolResultHeader")
        self.result_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.result_toggle.setCheckable(True)
        self.result_toggle.setAutoRaise(True)
        self.result_toggle.toggled.connect(self._show_result)
        layout.addWidget(self.result_toggle)
        self.result = QLabel(self)
        self.result.setObjectName("toolResult")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.PlainText)  # a tool's output: never rich text
        self.result.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.result)
        self._show_result(False)
        self.update_call(call)

    def _button(self, text: str, tip: str, answer: str) -> QPushButton:
        b = QPushButton(text, self.approval)
        b.setObjectName("toolApprovalButton")
        b.setToolTip(tip)
        b.clicked.connect(lambda: self._answer(answer))
        return b

    def _answer(self, answer: str) -> None:
        for b in (self.allow_once, self.allow_always, self.deny):
            b.setEnabled(False)  # one answer; the block says what became of it next
        if self.answer_to is not None:
            self.answer_to(self.call.get("id", ""), answer)

    @property
    def asking(self) -> bool:
        return self.approval.isVisibleTo(self)

    @property
    def result_expanded(self) -> bool:
        return self.result_toggle.isChecked()

    def update_call(self, call: dict) -> None:
        if call == self.call:
            return
        self.call = dict(call)
        asking = call.get("state") == "asking" and self.answer_to is not None
        self.approval.setVisible(asking)
        for b in (self.allow_once, self.allow_always, self.deny):
            b.setEnabled(asking)
        line = status_line(call)
        self.status.setText(line)
        self.status.setVisible(bool(line))
        text = call.get("result") or ""
        self.result_toggle.setVisible(bool(text))
        error = bool(call.get("is_error"))
        for w, name in ((self.result_toggle, "toolResultHeader"), (self.result, "toolResult")):
            w.setObjectName(name + ("Error" if error else ""))
            w.style().unpolish(w)
            w.style().polish(w)
        first = " ".join(text.split())
        preview = first if len(first) <= PREVIEW_CHARS else first[: PREVIEW_CHARS - 1] + "…"
        said = "" if error and preview.lower().startswith("error") else ("Error: " if error else "Result: ")
        self.result_toggle.setText(said + preview)
        total = call.get("result_chars") or len(text)
        shown = text if total <= len(text) else text + f"\n\n[… {total - len(text):,} more characters not kept here]"
        self.result.setText(shown)

    def _show_result(self, shown: bool) -> None:
        self.result_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.result_toggle.setToolTip(("Hide" if shown else "Show") + " what the tool gave back")
        self.result.setVisible(shown and bool(self.result.text()))


class ToolCallsPanel(QWidget):
    """A reply's calls, in order, above its answer."""

    def __init__(self, browser: type, parent=None):
        super().__init__(parent)
        self.setObjectName("toolCalls")
        self.browser = browser
        self.calls: list[dict] = []
        self.views: list[ToolCallView] = []
        self.answer: Optional[Answer] = None
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 2, 0, 2)
        box.setSpacing(4)
        self.hide()

    def set_calls(self, calls: list[dict], answer: Optional[Answer] = None) -> None:
        """Show ``calls`` (the live ones while the reply runs, with ``answer`` for the user's word; the stored ones
        after). A block already shown for a call is kept (its folds stay as the user left them)."""
        if answer is not None:
            self.answer = answer
        if calls == self.calls and (answer is None or all(v.answer_to is answer for v in self.views)):
            return
        self.calls = [dict(c) for c in calls]
        keep = {v.call.get("id"): v for v in self.views}
        views = []
        for c in self.calls:
            view = keep.pop(c.get("id"), None)
            if view is None or view.call.get("name") != c.get("name"):
                view = ToolCallView(c, self.browser, self.answer, self)
            else:
                view.answer_to = self.answer
                view.update_call(c)
            views.append(view)
        for old in keep.values():
            old.setParent(None)
            old.deleteLater()
        layout = self.layout()
        for i, view in enumerate(views):
            if layout.indexOf(view) != i:
                layout.insertWidget(i, view)
            view.show()
        self.views = views
        self.setVisible(bool(views))

    def view(self, call_id: str) -> Optional[ToolCallView]:
        return next((v for v in self.views if v.call.get("id") == call_id), None)

    @classmethod
    def of(cls, message) -> "ToolCallsPanel":
        """``message``'s panel (a MessageWidget's), made the first time, above its answer."""
        panel = getattr(message, "tool_panel", None)
        if panel is None:
            panel = cls(type(message.browser), message)
            layout = message.layout()
            layout.insertWidget(layout.indexOf(message.browser), panel)
            message.tool_panel = panel
        return panel

    @classmethod
    def show_in(cls, message, stats: dict) -> Optional["ToolCallsPanel"]:
        """What a message's stats say of its calls (called as it renders): a stored reply's calls; a reply being
        written keeps the live ones it was handed."""
        calls = (stats or {}).get("tool_calls") if getattr(message, "role", "") == "assistant" else None
        panel = getattr(message, "tool_panel", None)
        if calls:
            panel = cls.of(message)
            panel.set_calls(calls)
        elif panel is not None and not message.streaming:
            panel.set_calls([])
        return panel
