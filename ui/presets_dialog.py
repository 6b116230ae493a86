"""Model → Presets → Manage presets…: load, rename and delete the saved configurations."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
)

from .protocols import PresetStoreLike
from .signals import emit


class PresetsDialog(QDialog):
    changed = Signal()  # a preset was renamed or deleted
    load_requested = Signal(str)  # a preset's name

    def __init__(self, presets: PresetStoreLike, parent=None):
        super().__init__(parent)
        self.store = presets
        self.setWindowTitle("Presets")
        self.resize(560, 360)
        v = QVBoxLayout(self)
        self.list = QListWidget()
        self.list.setToolTip("Saved configurations; each is a JSON file in Redline's config folder")
        self.list.itemDoubleClicked.connect(lambda _i: self.load())
        v.addWidget(self.list, 1)
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextSelectableByMouse)
        v.addWidget(self.detail)
        row = QHBoxLayout()
        self.load_button = QPushButton("&Load")
        self.load_button.setToolTip("Load this preset's model and settings")
        self.rename_button = QPushButton("&Rename…")
        self.rename_button.setToolTip("Give the preset another name (its file is renamed too)")
        self.delete_button = QPushButton("&Delete")
        self.delete_button.setToolTip("Delete the preset's file (the model itself is not touched)")
        for b in (self.load_button, self.rename_button, self.delete_button):
            row.addWidget(b)
        row.addStretch(1)
        close = QDialogButtonBox(QDialogButtonBox.Close)
        close.rejected.connect(self.reject)
        row.addWidget(close)
        v.addLayout(row)
        self.load_button.clicked.connect(self.load)
        self.rename_button.clicked.connect(self._ask_rename)
        self.delete_button.clicked.connect(self._ask_delete)
        self.list.currentItemChanged.connect(lambda *_: self._show_detail())
        self.refresh()

    def refresh(self, select: str | None = None) -> None:
        self.list.clear()
        for p in self.store.presets():
            item = QListWidgetItem(p.name)
            item.setData(Qt.UserRole, p.name)
            item.setToolTip(p.describe())
            self.list.addItem(item)
            if p.name == select:
                self.list.setCurrentItem(item)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        self._show_detail()

    def current(self) -> str | None:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item else None

    def _show_detail(self) -> None:
        name = self.current()
        preset = self.store.get(name) if name else None
        problems = "\n".join(f"Skipped: {p}" for p in self.store.problems)
        self.detail.setText(
            (preset.describe() if preset else "No presets yet.") + ("\n" + problems if problems else "")
        )
        for b in (self.load_button, self.rename_button, self.delete_button):
            b.setEnabled(preset is not None)

    def load(self) -> None:
        name = self.current()
        if name:
            emit(self.load_requested, name)
            self.accept()

    def rename(self, old: str, new: str) -> bool:
        try:
            self.store.rename(old, new)
        except ValueError as exc:  # PresetError: shown in place, the preset stays as it was
            self.detail.setText(f"Not renamed: {exc}")
            self.detail.setStyleSheet("color: #c0182b;")
            return False
        self.detail.setStyleSheet("")
        self.refresh(select=new.strip())
        emit(self.changed)
        return True

    def delete(self, name: str) -> None:
        self.store.delete(name)
        self.refresh()
        emit(self.changed)

    def _ask_rename(self) -> None:
        old = self.current()
        if not old:
            return
        new, ok = QInputDialog.getText(self, "Rename preset", "New name:", text=old)
        if ok and new.strip() and new.strip() != old:
            self.rename(old, new)

    def _ask_delete(self) -> None:
        name = self.current()
        if (
            name
            and QMessageBox.question(self, "Delete preset", f"Delete the preset “{name}”?")
            == QMessageBox.StandardButton.Yes
        ):
            self.delete(name)
