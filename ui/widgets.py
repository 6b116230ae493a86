"""Small widgets the window is built from: the message input, the banner, the notices, the load bar."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from redline.ui.signals import emit

LARGE_PASTE_CHARS = 100_000  # a paste beyond this is held aside, not typeset into the editor


class MessageInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line.

    A very large paste (a log, a whole file) is not typeset into the editor — laying out megabytes of
    text would freeze the window. It is kept aside and shown as one placeholder line; ``message_text()``
    puts it back in when the message is sent. Deleting the placeholder drops the paste.
    """

    submitted = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._pastes: dict[str, str] = {}
        self.setObjectName("messageInput")
        self.setPlaceholderText("Message — Enter sends, Shift+Enter adds a line, Esc stops")
        self.setTabChangesFocus(True)
        self.setFixedHeight(84)

    def insertFromMimeData(self, source):  # noqa: N802 - Qt override
        text = source.text() if source.hasText() else ""
        if len(text) <= LARGE_PASTE_CHARS:
            super().insertFromMimeData(source)
            return
        marker = f"[pasted text #{len(self._pastes) + 1}: {len(text):,} characters]"
        self._pastes[marker] = text
        self.insertPlainText(marker)

    def message_text(self) -> str:
        """What the user means to send: the editor's text with held-aside pastes put back."""
        text = self.toPlainText()
        for marker, pasted in self._pastes.items():
            text = text.replace(marker, pasted)
        return text

    def clear(self) -> None:
        self._pastes.clear()
        super().clear()

    def keyPressEvent(self, event):  # noqa: N802
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not (event.modifiers() & Qt.ShiftModifier):
            emit(self.submitted)
            return
        super().keyPressEvent(event)


class Banner(QFrame):
    """One message across the top of the window: what happened and what to do. The next message replaces it;
    what must stay until the user has read it goes to ``NoticeArea``."""

    COLORS = {"info": ("#eef4ff", "#2d5bd0"), "warning": ("#fff6e5", "#b26a00"), "error": ("#fdecee", "#c0182b")}

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.kind = "info"
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(10, 6, 6, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self._layout.addWidget(self.label, 1)
        self._buttons: list[QPushButton] = []
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.hide)
        self._layout.addWidget(self.close_button)
        self.hide()

    def show_message(self, text: str, kind: str = "info", actions: list[tuple[str, object]] = ()) -> None:
        self.kind = kind
        bg, fg = self.COLORS.get(kind, self.COLORS["info"])
        self.setStyleSheet(
            f"QFrame#banner {{ background: {bg}; border: 1px solid {fg}; border-radius: 6px; }}"
            f"QFrame#banner QLabel {{ color: {fg}; }}"
        )
        self.label.setText(text)
        for b in self._buttons:
            b.setParent(None)
            b.deleteLater()
        self._buttons = []
        for title, slot in actions:
            b = QPushButton(title)
            b.clicked.connect(slot)
            self._layout.insertWidget(self._layout.count() - 1, b)
            self._buttons.append(b)
        self.show()

    def buttons(self) -> list[QPushButton]:
        return list(self._buttons)


class NoticeArea(QWidget):
    """Notices that stay until the user dismisses each (✕): e.g. that the settings file or the conversation
    database was unreadable and set aside. Any number stack here, above the banner, whose one transient
    message (loading, a failed reply) comes and goes without touching them."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("notices")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self._notices: list[Banner] = []
        self.hide()

    def add(self, text: str, kind: str = "warning", actions: list[tuple[str, object]] = ()) -> Banner:
        notice = Banner(self)
        notice.show_message(text, kind, actions)
        notice.close_button.setToolTip("Dismiss this notice")
        notice.close_button.clicked.connect(lambda: self.dismiss(notice))
        self._layout.addWidget(notice)
        self._notices.append(notice)
        self.show()
        return notice

    def dismiss(self, notice: Banner) -> None:
        if notice in self._notices:
            self._notices.remove(notice)
            notice.hide()
            notice.setParent(None)
            notice.deleteLater()
        self.setVisible(bool(self._notices))

    def notices(self) -> list[Banner]:
        return list(self._notices)

    def texts(self) -> list[str]:
        return [n.label.text() for n in self._notices]


class LoadBar(QFrame):
    """Loading progress with a cancel button."""

    cancel_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("loadBar")
        h = QHBoxLayout(self)
        h.setContentsMargins(10, 2, 10, 2)
        self.label = QLabel("Loading…")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(12)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_requested)
        h.addWidget(self.label)
        h.addWidget(self.bar, 1)
        h.addWidget(self.cancel_button)
        self.hide()

    def set_progress(self, fraction: float, phase: str) -> None:
        self.bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        self.label.setText(phase)
