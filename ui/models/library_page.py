"""The local library: every model on disk (hub cache, GGUF files, converted folders, the starter, recent local
folders) with its size and when it was last used, what can be reclaimed (partial downloads, unfinished or
orphaned conversions), and Delete, which says the space it frees before anything is deleted. Listing and
deleting run off the UI thread."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

from ...inference import age_text, delete_local_model, delete_text, format_bytes, local_library, reclaimable_bytes
from ..signals import emit
from .background import BackgroundWork
from .find_page import _item, _table, sentence

COLUMNS = ("Model", "Kind", "Size", "Last used", "Note")
LOADED_NOW = "loaded now"  # the model in use: its files' access time is when it was loaded, not when last used


class LibraryPage(QWidget):
    chosen = Signal(str)  # a model to use (what to pass as --model)
    changed = Signal()

    def __init__(
        self,
        recent: list[str],
        confirm: Optional[Callable[[str], bool]] = None,
        parent=None,
        loaded: tuple[str, ...] = (),
    ):
        """``loaded``: what names the model loaded now (its spec, its name), to show it as in use."""
        super().__init__(parent)
        self.recent = list(recent)
        self.loaded = {name for name in loaded if name}
        self.confirm = confirm or self._ask
        self.work = BackgroundWork(self)
        self.rows: list = []
        v = QVBoxLayout(self)
        self.table = _table(COLUMNS)
        self.table.setObjectName("libraryTable")
        v.addWidget(self.table, 1)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        v.addWidget(self.summary)
        buttons = QHBoxLayout()
        self.refresh_button = QPushButton("&Refresh")
        self.use_button = QPushButton("&Use")
        self.delete_button = QPushButton("&Delete…")
        buttons.addWidget(self.refresh_button)
        buttons.addStretch(1)
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.delete_button)
        v.addLayout(buttons)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        v.addWidget(self.status)
        self.refresh_button.clicked.connect(self.refresh)
        self.delete_button.clicked.connect(self.delete_selected)
        self.use_button.clicked.connect(self._use)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    def refresh(self, then: str = "") -> None:
        """List again; ``then``: the status to show once listed (what the last Delete freed)."""
        self._then = then
        self.status.setText(then or "Reading what is on disk…")
        recent = self.recent
        self.work.run("list", lambda: local_library(recent), self._show, lambda e: self.status.setText(sentence(e)))

    def _show(self, rows) -> None:
        self.rows = rows
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            kind = "reclaimable" if r.reclaimable else r.kind
            used = LOADED_NOW if not r.reclaimable and {r.model, r.name} & self.loaded else age_text(r.last_used)
            cells = (r.name, kind, format_bytes(r.size_bytes), used, r.note)
            for j, text in enumerate(cells):
                self.table.setItem(i, j, _item(text, i if j == 0 else None))
        total = sum(r.size_bytes for r in rows if not r.reclaimable)
        spare = reclaimable_bytes(rows)
        n = sum(not r.reclaimable for r in rows)
        text = f"{n} model{'s' if n != 1 else ''}, {format_bytes(total)} on disk."
        if spare:
            text += f" {format_bytes(spare)} can be reclaimed (partial downloads, leftover conversions)."
        self.summary.setText(text)
        self.status.setText(getattr(self, "_then", ""))
        self._update_buttons()
        emit(self.changed)

    def selected(self):
        rows = self.table.selectionModel().selectedRows()
        return self.rows[rows[0].row()] if rows else None

    def _update_buttons(self) -> None:
        row = self.selected()
        self.delete_button.setEnabled(row is not None)
        self.use_button.setEnabled(row is not None and bool(row.model))

    def _ask(self, text: str) -> bool:
        answer = QMessageBox.question(self, "Delete", text + "\n\nDelete it?", QMessageBox.Yes | QMessageBox.No)
        return answer == QMessageBox.Yes

    def delete_selected(self) -> None:
        row = self.selected()
        if row is None:
            return
        text = delete_text(row)
        if not self.confirm(text):
            return
        self.status.setText(f"Deleting {row.name}…")
        self.delete_button.setEnabled(False)

        def done(freed: int) -> None:
            self.refresh(f"Deleted {row.name}: {format_bytes(freed)} freed.")

        self.work.run("delete", lambda: delete_local_model(row), done, lambda e: self.status.setText(sentence(e)))

    def _use(self) -> None:
        row = self.selected()
        if row is not None and row.model:
            emit(self.chosen, row.model)

    def shutdown(self) -> None:
        self.work.shutdown()
