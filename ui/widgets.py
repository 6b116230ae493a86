"""Small widgets the window is built from: the message input, the banner, the notices, the load bar, and the
overlay they float in (over the top of the page, so that coming and going they never move what is under the
pointer)."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QRect, QSize, Qt, QTimer, Signal
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

from .signals import emit
from .style import READING_WIDTH, current_theme

LARGE_PASTE_CHARS = 100_000  # a paste beyond this is held aside, not typeset into the editor


class MessageInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line.

    A very large paste (a log, a whole file) is not typeset into the editor — laying out megabytes of
    text would freeze the window. It is kept aside and shown as one placeholder line; ``message_text()``
    puts it back in when the message is sent. Deleting the placeholder drops the paste.

    Files dropped or pasted (their local addresses) are not typed in: they are offered as attachments
    (``files_given``), and so is an image pasted without text (``image_given``, a QImage).
    """

    submitted = Signal()
    files_given = Signal(list)  # paths of local files dropped on the box or pasted into it
    image_given = Signal(object)  # a QImage pasted (a screenshot) or dropped
    # The box's own keys (not window actions: they act only while typing here), listed by Help → Keyboard shortcuts.
    KEYS = (("Enter", "Send the message"), ("Shift+Enter", "A new line in the message"))

    def __init__(self, parent=None):
        super().__init__(parent)
        self._pastes: dict[str, str] = {}
        self.setObjectName("messageInput")
        self.setPlaceholderText("Message — Enter sends, Shift+Enter adds a line, Esc stops")
        self.setTabChangesFocus(True)
        self.setFixedHeight(84)

    def canInsertFromMimeData(self, source) -> bool:  # noqa: N802 - Qt override
        return bool(local_files(source)) or source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source):  # noqa: N802 - Qt override
        files = local_files(source)
        if files:
            emit(self.files_given, files)
            return
        if source.hasImage() and not source.hasText():
            image = source.imageData()
            emit(self.image_given, image.toImage() if hasattr(image, "toImage") else image)
            return
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


def local_files(mime) -> list[str]:
    """The paths of what was dropped or pasted, when every address in it is a local file (a file manager's copy or
    drag); [] for text, a web link, or a mix."""
    if mime is None or not mime.hasUrls():
        return []
    urls = mime.urls()
    if not urls or not all(u.isLocalFile() for u in urls):
        return []
    return [u.toLocalFile() for u in urls]


class Banner(QFrame):
    """One message across the top of the window: what happened and what to do. The next message replaces it;
    what must stay until the user has read it goes to ``NoticeArea``. Its colours are the theme's for its kind."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.kind = "info"
        self._styled = ""  # the theme and kind its colours were set for
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
        self._restyle()
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

    def _restyle(self) -> None:
        theme = current_theme()
        if self._styled == f"{theme.name}:{self.kind}":
            return
        self._styled = f"{theme.name}:{self.kind}"
        bg, fg = theme.banner(self.kind)
        self.setStyleSheet(
            f"QFrame#banner {{ background: {bg}; border: 1px solid {fg}; border-radius: 8px; }}"
            f"QFrame#banner QLabel, QFrame#banner QToolButton {{ color: {fg}; }}"
        )

    def changeEvent(self, event):  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange:  # the theme changed (apply_theme sets the application's palette)
            self._restyle()


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


class Overlay(QWidget):
    """A column of transient widgets (the notices, the banner, the load bar) floating over the top of a page, at
    the reading column's width: shown while one of them is, sized to them, never in a layout, so they do not push
    the chat down as they come and go. ``anchor()`` gives the page's rectangle in the parent's coordinates."""

    def __init__(self, parent: QWidget, anchor: Callable[[], QRect]):
        super().__init__(parent)
        self.setObjectName("overlay")
        self._anchor = anchor
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(4)
        self._items: list[QWidget] = []
        self._pending = False
        parent.installEventFilter(self)
        self.hide()

    def add(self, widget: QWidget) -> None:
        self._layout.addWidget(widget)
        self._items.append(widget)
        widget.installEventFilter(self)

    def follow(self, widget: QWidget) -> None:
        """Place again when ``widget`` (what the anchor is read from) moves or is resized."""
        widget.installEventFilter(self)

    def eventFilter(self, obj, event):  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.ShowToParent, QEvent.HideToParent) and obj in self._items:
            self.place()  # at once: whoever showed a banner may ask right away whether it is visible
        elif kind in (QEvent.Show, QEvent.Resize, QEvent.Move, QEvent.LayoutRequest):
            self.place_later()
        return False

    def place_later(self) -> None:
        if not self._pending:
            self._pending = True
            QTimer.singleShot(0, self.place)

    def place(self) -> None:
        self._pending = False
        shown = any(not w.isHidden() for w in self._items)
        if not shown:
            self.hide()
            return
        rect = self._anchor()
        width = max(200, min(rect.width() - 24, READING_WIDTH))
        self._layout.activate()
        height = (
            self._layout.totalHeightForWidth(width)
            if self._layout.hasHeightForWidth()
            else self._layout.totalSizeHint().height()
        )
        height = max(height, self._layout.totalMinimumSize().height())
        self.setGeometry(rect.x() + (rect.width() - width) // 2, rect.y() + 8, width, height)
        self.show()
        self.raise_()


class ElidedLabel(QLabel):
    """A one-line label that gives up width: too narrow for its text, it ends the text with "…" and keeps the whole
    text as its tooltip. A plain QLabel asks for its whole text's width as its minimum, so a long line (the status
    bar's note about what auto chose) made the window wider than a 1366-pixel laptop screen."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(parent)
        self._full = ""
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        self._full = text
        self.setToolTip(text)
        self._elide()

    def text(self) -> str:
        return self._full

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance("…") * 4, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 8, super().sizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.ElideRight, max(self.width(), 1))
        super().setText(shown)
