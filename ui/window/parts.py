"""Small collaborators the window's controllers share instead of the window itself: the settings (read, changed,
saved), the message box with its buttons, and the status line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QStatusBar

from ..signals import emit
from ..widgets import ElidedLabel, MessageInput


class SettingsHolder(QObject):
    """The settings in use (a frozen dataclass, replaced whole): ``value``; ``set(new)`` saves and announces it."""

    changed = Signal(object)  # the new settings

    def __init__(self, value: Any, save: Callable[[Any], None], parent=None):
        super().__init__(parent)
        self.value = value
        self._save = save

    def set(self, new: Any) -> None:
        self.value = new
        self._save(new)
        emit(self.changed, new)


@dataclass
class Composer:
    """Where the user writes: the message box, the note shown while editing a sent message, Send and Stop."""

    input: MessageInput
    edit_bar: QLabel
    send_button: QPushButton
    stop_button: QPushButton


class StatusLine:
    """The status bar: its passing messages, the standing note about the model (what auto chose) and the model's
    permanent label. The note is a label of the bar, not a message: a menu's status tips replace the bar's message
    and clear it when the pointer leaves, which erased a note kept as a message; a passing message covers the
    label while it shows, and the note is back after it."""

    def __init__(self, bar: QStatusBar, model_label: QLabel):
        self.bar = bar
        self.model_label = model_label
        self.note_label = ElidedLabel("")  # elided, so a long note never widens the window
        self.note_label.setObjectName("statusNote")
        bar.addWidget(self.note_label, 1)

    def say(self, text: str, timeout_ms: int = 0) -> None:
        self.bar.showMessage(text, timeout_ms)

    def clear(self) -> None:
        self.bar.clearMessage()

    def message(self) -> str:
        return self.bar.currentMessage()

    def set_note(self, text: str) -> None:
        self.note_label.setText(text)

    def note(self) -> str:
        return self.note_label.text()
