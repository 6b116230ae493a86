"""The conversation list: search by title, new, rename, delete.

Newest first, but a conversation moves up only when it is touched (its reply finished, or it was just created):
sending a message bumps its time in the store at once, and a list read again meanwhile (a search, a rename, a
deletion) must not move a chat whose reply is still being written — a click would land on another chat. So the
list orders by the time it last showed for each conversation, the store's only for those it has not shown."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from .protocols import ConversationStore
from .signals import emit
from .style import set_icon


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
        self.new_button.setObjectName("newChatButton")
        set_icon(self.new_button, "plus")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setObjectName("conversationSearch")
        self.search.setPlaceholderText("Search titles… (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self.refresh())
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setObjectName("conversationItems")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # long titles are elided instead
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setUniformItemSizes(True)  # one row height: no per-item measuring with thousands of chats
        self.list.currentItemChanged.connect(self._on_current)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        layout.addWidget(self.list, 1)
        row = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.setObjectName("listButton")
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("listButton")
        self.delete_button.clicked.connect(self.delete_current)
        row.addWidget(self.rename_button)
        row.addWidget(self.delete_button)
        layout.addLayout(row)
        self._silent = False
        self._shown_at: dict[int, float] = {}  # conversation id -> the time it was listed by (see the docstring)
        self.refresh()

    def first_id(self) -> Optional[int]:
        """The conversation at the top of the list as shown."""
        item = self.list.item(0)
        return item.data(Qt.UserRole) if item else None

    def current_id(self) -> Optional[int]:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item else None

    def refresh(self, select: Optional[int] = None) -> None:
        keep = select if select is not None else self.current_id()
        self._silent = True
        self.list.clear()
        convs = self.store.conversations(self.search.text())
        for conv in convs:
            self._shown_at.setdefault(conv.id, getattr(conv, "updated", 0.0))
        convs.sort(key=lambda c: (self._shown_at[c.id], c.id), reverse=True)  # the store's order, less its bumps
        for conv in convs:
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
        self.touch(conversation_id, select=True)

    def touch(self, conversation_id: int, select: bool = False) -> None:
        """A conversation was just active: move it to the top (the list is newest first) without rebuilding
        thousands of rows. With a search filter in place, the filtered list is read again instead."""
        conv = self.store.conversation(conversation_id)
        if conv is not None:
            # Above every other (the store's clock may tie with the conversation touched last).
            newest = max((t for cid, t in self._shown_at.items() if cid != conversation_id), default=0.0)
            self._shown_at[conversation_id] = max(getattr(conv, "updated", 0.0), newest + 1e-6)
        if self.search.text() or conv is None:
            self.refresh(select=conversation_id if select else None)
            return
        keep = conversation_id if select else self.current_id()
        self._silent = True
        item = None
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.UserRole) == conversation_id:
                item = self.list.takeItem(i)
                break
        if item is None:
            item = QListWidgetItem()
            item.setData(Qt.UserRole, conversation_id)
        item.setText(conv.title)
        item.setToolTip(conv.title)
        self.list.insertItem(0, item)
        if keep == conversation_id:
            self.list.setCurrentItem(item)
        self._silent = False
        has = self.current_id() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def _on_current(self, current, _previous) -> None:
        has = current is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)
        if has and not self._silent:
            emit(self.selected, current.data(Qt.UserRole))

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
        answer = QMessageBox.question(
            self, "Delete conversation", f"Delete “{conv.title if conv else cid}” and all its messages?"
        )
        if answer == QMessageBox.Yes:
            self.store.delete_conversation(cid)
            self.refresh()
            emit(self.deleted, cid)

    def _menu(self, pos) -> None:
        if self.list.itemAt(pos) is None:
            return
        menu = QMenu(self)
        menu.addAction("Rename…", self.rename_current)
        menu.addAction("Delete…", self.delete_current)
        menu.exec(self.list.mapToGlobal(pos))
