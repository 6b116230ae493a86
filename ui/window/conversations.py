"""Which conversation the window shows: opening one (its newest page of messages; older pages load on
scroll), starting a new chat, following a deletion, saving the system prompt. A reply still being written
in a conversation is shown growing whenever that conversation is opened (``ReplyController.reattach``)."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QObject

from redline.ui.chat_view import PAGE

TITLE_CHARS = 48  # a new conversation is titled with the first line of its first message, this long at most


class ConversationController(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.conversation_id: Optional[int] = None  # the open one; None: a new chat not saved yet

    def showing(self, conversation_id: int) -> bool:
        return self.conversation_id == conversation_id

    def open_latest(self) -> None:
        convs = self.window.store.conversations()
        if convs:
            self.open(convs[0].id)
        else:
            self.new_chat()

    def new_chat(self) -> None:
        w = self.window
        self.conversation_id = None
        w.replies.end_edit()
        w.system_prompt.setText("")
        self.show_open()
        w.conversations.list.clearSelection()
        w.conversations.list.setCurrentItem(None)
        w.input.setFocus()

    def open(self, conversation_id: int) -> None:
        w = self.window
        conv = w.store.conversation(conversation_id)
        if conv is None:
            return
        self.conversation_id = conversation_id
        w.replies.end_edit()
        w.system_prompt.setText(conv.system_prompt)
        if w.conversations.current_id() != conversation_id:
            w.conversations.select(conversation_id)
        self.show_open()

    def ensure_open(self, first_message: str) -> int:
        """The open conversation's id; a new chat is saved first, titled after ``first_message``."""
        w = self.window
        if self.conversation_id is None:
            title = first_message.splitlines()[0][:TITLE_CHARS]
            conv = w.store.create_conversation(title, w.system_prompt.text())
            self.conversation_id = conv.id
            w.conversations.select(conv.id)
        return self.conversation_id

    def show_open(self) -> None:
        """Show the open conversation: its newest page of messages; older pages load on scroll."""
        w = self.window
        w.replies.detach_widgets()
        if self.conversation_id is None:
            w.chat_view.clear()
            w.update_controls()
            return
        cid, store = self.conversation_id, w.store
        page = store.messages(cid, limit=PAGE)
        earlier = store.message_count(cid, page[0].position) if page else 0
        w.chat_view.show_messages(
            page,
            earlier,
            lambda before, after, n: store.messages(cid, limit=n, before_position=before, after_position=after),
        )
        w.replies.reattach(cid)
        w.update_controls()  # Send and Stop follow the chat on screen

    def deleted(self, conversation_id: int) -> None:
        self.window.replies.stop_in(conversation_id)
        if self.conversation_id == conversation_id:
            self.open_latest()

    def save_system_prompt(self) -> None:
        if self.conversation_id is not None:
            self.window.store.set_system_prompt(self.conversation_id, self.window.system_prompt.text())
