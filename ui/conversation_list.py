"""The conversation list: search by title, new, rename, delete."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QInputDialog, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QMessageBox, QPushButton, QVBoxLayout, QWidget)

from .protocols import ConversationStore


class ConversationList(QWidget):
    selected = Signal(int)  # conversation id
    new_requested = Signal()
    deleted = Signal(int)

    def __init__(self, store: ConversationStore, parent=None):
        super().__init__(parent)
        self.store = store
        self.setObjectName("conversationList")
        self.setMinimumWidth(180)
        self.setMaximumWidth(280)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search titles…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self.refresh())
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # long titles are elided instead
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        layout.addWidget(self.list, 1)
        row = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_current)
        row.addWidget(self.rename_button)
        row.addWidget(self.delete_button)
        layout.addLayout(row)
        self._silent = False
        self.refresh()

    def current_id(self) -> Optional[int]:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item else None

    def refresh(self, select: Optional[int] = None) -> None:
        keep = select if select is not None else self.current_id()
        self._silent = True
        self.list.clear()
        for conv in self.store.conversations(self.search.text()):
            item = QListWidgetItem(conv.title)
            item.setData(Qt.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if conv.id == keep:
                self.list.setCurrentItem(item)
        self._silent = False
        has = self.current_id() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def select(self, conversation_id: int) -> None:
        self.refresh(select=conversation_id)

    def _on_current(self, current, _previous) -> None:
        has = current is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)
        if has and not self._silent:
            self.selected.emit(current.data(Qt.UserRole))

    def rename_current(self) -> None:
        cid = self.current_id()
        if cid is None:
            return
        conv = self.store.conversation(cid)
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=conv.title if conv else "")
        if ok and title.strip():
            self.store.rename_conversation(cid, title.strip())
            self.refresh(select=cid)

    def delete_current(self) -> None:
        cid = self.current_id()
        if cid is None:
            return
        conv = self.store.conversation(cid)
        answer = QMessageBox.question(self, "Delete conversation",
                                      f"Delete “{conv.title if conv else cid}” and all its messages?")
        if answer == QMessageBox.Yes:
            self.store.delete_conversation(cid)
            self.refresh()
            self.deleted.emit(cid)

    def _menu(self, pos) -> None:
        if self.list.itemAt(pos) is None:
            return
        menu = QMenu(self)
        menu.addAction("Rename…", self.rename_current)
        menu.addAction("Delete…", self.delete_current)
        menu.exec(self.list.mapToGlobal(pos))
