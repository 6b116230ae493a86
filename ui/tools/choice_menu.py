"""Which tools one chat offers: the menu of the Tools button's arrow. It lists every tool known now — Redline's own,
then each listed server's — each with a tick (ticked: offered to the model in this chat), a line for each server
whose tools are not listed (not started yet, starting, or could not start), and **Offer all**. A click on a tool
ticks or unticks it and leaves the menu open, so several can be changed at once; the window's tools controller
keeps the choice with the conversation and counts what the ticked ones cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu, QWidget


@dataclass(frozen=True)
class ToolChoice:
    name: str  # as the model is offered it: "echo__add", "calculate"
    label: str  # for a person: "echo · add", "calculate (built-in)"
    description: str
    ticked: bool


class ToolsMenu(QMenu):
    """``choices()``: the tools to list; ``notes()``: a line for each server whose tools are not listed;
    ``tick(name, ticked)``: the user's click; ``tick_all()``: Offer all."""

    def __init__(
        self,
        choices: Callable[[], list[ToolChoice]],
        notes: Callable[[], list[str]],
        tick: Callable[[str, bool], None],
        tick_all: Callable[[], None],
        parent: Optional[QWidget] = None,
    ):
        super().__init__(parent)
        self.setObjectName("toolsMenu")
        self.setToolTipsVisible(True)
        self._choices, self._notes, self._tick, self._tick_all = choices, notes, tick, tick_all
        self.aboutToShow.connect(self.refresh)

    def refresh(self) -> None:
        """Build the list again from what is known now."""
        self.clear()
        choices = self._choices()
        self.addAction("Offered in this chat:").setEnabled(False)  # a heading (a section is a bare line in Fusion)
        for c in choices:
            action = self.addAction(c.label)
            action.setCheckable(True)
            action.setChecked(c.ticked)
            action.setData(c.name)
            action.setToolTip(c.description or c.name)
            action.toggled.connect(lambda on, name=c.name: self._tick(name, on))
        for line in self._notes():
            self.addAction(line).setEnabled(False)
        if not choices and not self._notes():
            self.addAction("No tools: turn on Redline's own or add MCP servers in Settings → Tools").setEnabled(False)
        self.addSeparator()
        every = self.addAction("Offer all")
        every.setEnabled(any(not c.ticked for c in choices))
        every.triggered.connect(lambda _checked=False: self._tick_all())

    def tool_actions(self) -> dict:
        """The tools' actions, by the name each tool is offered as (for tests and the screenshots)."""
        return {a.data(): a for a in self.actions() if a.isCheckable()}

    # A tool's tick changes without closing the menu (QMenu closes on any triggered action otherwise).
    def mouseReleaseEvent(self, event):  # noqa: N802 - Qt override
        action = self.activeAction()
        if action is not None and action.isCheckable() and action.isEnabled():
            action.trigger()
            return
        super().mouseReleaseEvent(event)

    def keyPressEvent(self, event):  # noqa: N802 - Qt override
        action = self.activeAction()
        ticks = event.key() in (Qt.Key_Return, Qt.Key_Enter, Qt.Key_Space)
        if ticks and action is not None and action.isCheckable() and action.isEnabled():
            action.trigger()
            return
        super().keyPressEvent(event)
