"""Small collaborators the window's controllers share instead of the window itself: the settings (read, changed,
saved), the message box with its buttons, and the status line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QStatusBar

from redline.ui.signals import emit
from redline.ui.widgets import MessageInput


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


@dataclass
class StatusLine:
    """The status bar: its transient message and the model's permanent label."""

    bar: QStatusBar
    model_label: QLabel

    def say(self, text: str, timeout_ms: int = 0) -> None:
        self.bar.showMessage(text, timeout_ms)

    def clear(self) -> None:
        self.bar.clearMessage()

    def message(self) -> str:
        return self.bar.currentMessage()
