"""Settings as a dialog beside the window (it was a dock that squeezed the chat to 220-400 px): not modal, so the
chat goes on underneath; Esc closes it, and so does its own shortcut (Ctrl+,) pressed again."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QDialog, QFrame, QScrollArea, QTabWidget, QVBoxLayout, QWidget

from ..settings_panel import SettingsPanel

MAX_HEIGHT = 760  # the form's rows at their size; a smaller screen scrolls them


class SettingsDialog(QDialog):
    def __init__(self, panel: SettingsPanel, parent=None):
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Settings")
        self.setModal(False)
        self.panel = panel
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        # Pages in tabs (General, then Tools: ``add_page``), each in a scroll area: the form's rows are taller than a
        # 1366×768 laptop screen leaves a window.
        self.pages = QTabWidget()
        self.pages.setDocumentMode(True)
        self.pages.addTab(_scrolled(panel), "General")
        layout.addWidget(self.pages)
        # Esc closes it wherever the focus is (an editable box such as Model would otherwise keep the key).
        QShortcut(QKeySequence(Qt.Key_Escape), self, self.close, context=Qt.WidgetWithChildrenShortcut)
        width = panel.minimumSizeHint().width() + 40
        self.setMinimumWidth(width)
        screen = QGuiApplication.primaryScreen()
        room = screen.availableGeometry().height() - 80 if screen is not None else MAX_HEIGHT
        self.resize(max(width, 520), max(320, min(MAX_HEIGHT, panel.sizeHint().height() + 24, room)))

    def add_page(self, widget: QWidget, title: str) -> None:
        """Another page of settings, in a tab of its own (Tools)."""
        self.pages.addTab(_scrolled(widget), title)

    def show_page(self, title: str) -> None:
        """Open the dialog on the page ``title``."""
        for i in range(self.pages.count()):
            if self.pages.tabText(i) == title:
                self.pages.setCurrentIndex(i)
        self.open_here()

    def toggle(self) -> None:
        """Open it where it was (raised, with the keyboard's focus), or close it if it is open."""
        if self.isVisible():
            self.close()
        else:
            self.open_here()

    def open_here(self) -> None:
        self.show()
        self.raise_()
        self.activateWindow()


def _scrolled(widget: QWidget) -> QScrollArea:
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    scroll.setWidget(widget)
    return scroll
