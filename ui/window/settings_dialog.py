"""Settings as a dialog beside the window (it was a dock that squeezed the chat to 220-400 px): not modal, so the
chat goes on underneath; Esc closes it, and so does its own shortcut (Ctrl+,) pressed again."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QDialog, QFrame, QScrollArea, QVBoxLayout

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
        # In a scroll area: the form's rows are taller than a 1366×768 laptop screen leaves a window.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        scroll.setWidget(panel)
        layout.addWidget(scroll)
        # Esc closes it wherever the focus is (an editable box such as Model would otherwise keep the key).
        QShortcut(QKeySequence(Qt.Key_Escape), self, self.close, context=Qt.WidgetWithChildrenShortcut)
        width = panel.minimumSizeHint().width() + 40
        self.setMinimumWidth(width)
        screen = QGuiApplication.primaryScreen()
        room = screen.availableGeometry().height() - 80 if screen is not None else MAX_HEIGHT
        self.resize(max(width, 520), max(320, min(MAX_HEIGHT, panel.sizeHint().height() + 24, room)))

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
