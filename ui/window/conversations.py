"""Which conversation the window shows: opening one (its newest page of messages; older pages load on
scroll), starting a new chat, following a deletion, saving the system prompt.

It says what it does through signals (``leaving`` before the view changes, ``opened`` after, ``deleted`` when a
conversation goes), which the reply controller follows: a reply still being written in a conversation is shown
growing whenever that conversation is opened."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLineEdit, QWidget

from ..chat_view import PAGE, ChatView
from ..conversation_list import ConversationList
from ..protocols import ConversationStore
from ..signals import emit

TITLE_CHARS = 48  # a new conversation is titled with the first line of its first message, this long at most


class ConversationController(QObject):
    leaving = Signal()  # the view is about to show another conversation (or a new chat): its widgets go
    opened = Signal(object)  # the conversation now shown (its id, or None for a new chat not saved yet)
    deleted = Signal(int)  # a conversation was deleted (its replies stop)

    def __init__(
        self,
        store: ConversationStore,
        listing: ConversationList,
        view: ChatView,
        system_prompt: QLineEdit,
        focus: QWidget,
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.store, self.listing, self.view = store, listing, view
        self.system_prompt, self.focus = system_prompt, focus
        self.conversation_id: Optional[int] = None  # the open one; None: a new chat not saved yet
        listing.selected.connect(self.open)
        listing.new_requested.connect(self.new_chat)
        listing.deleted.connect(self._deleted)
        system_prompt.editingFinished.connect(self.save_system_prompt)

    def showing(self, conversation_id: Optional[int]) -> bool:
        return self.conversation_id == conversation_id

    def open_latest(self) -> None:
        """The conversation at the top of the list as shown (the store's newest may be one whose reply is being
        written, not moved up yet), else a new chat."""
        first = self.listing.first_id()
        if first is None:
            convs = self.store.conversations()
            first = convs[0].id if convs else None
        if first is not None:
            self.open(first)
        else:
            self.new_chat()

    def new_chat(self) -> None:
        self.conversation_id = None
        self.system_prompt.setText("")
        self.show_open()
        self.listing.list.clearSelection()
        self.listing.list.setCurrentItem(None)
        self.focus.setFocus()

    def open(self, conversation_id: int) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None:
            return
        self.conversation_id = conversation_id
        self.system_prompt.setText(conv.system_prompt)
        if self.listing.current_id() != conversation_id:
            self.listing.select(conversation_id)
        self.show_open()

    def ensure_open(self, first_message: str) -> int:
        """The open conversation's id; a new chat is saved first, titled after ``first_message``."""
        if self.conversation_id is None:
            title = first_message.splitlines()[0][:TITLE_CHARS]
            conv = self.store.create_conversation(title, self.system_prompt.text())
            self.conversation_id = conv.id
            self.listing.select(conv.id)
        return self.conversation_id

    def show_open(self) -> None:
        """Show the open conversation: its newest page of messages; older pages load on scroll."""
        emit(self.leaving)
        if self.conversation_id is None:
            self.view.clear()
            emit(self.opened, None)
            return
        cid, store = self.conversation_id, self.store
        page = store.messages(cid, limit=PAGE)
        earlier = store.message_count(cid, page[0].position) if page else 0
        self.view.show_messages(
            page,
            earlier,
            lambda before, after, n: store.messages(cid, limit=n, before_position=before, after_position=after),
        )
        emit(self.opened, cid)

    def touch(self, conversation_id: int) -> None:
        """A reply ended there: it moves to the top of the list."""
        self.listing.touch(conversation_id)

    def _deleted(self, conversation_id: int) -> None:
        emit(self.deleted, conversation_id)
        if self.conversation_id == conversation_id:
            self.open_latest()

    def save_system_prompt(self) -> None:
        if self.conversation_id is not None:
            self.store.set_system_prompt(self.conversation_id, self.system_prompt.text())
