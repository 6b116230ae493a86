"""The main window's widgets and where they sit: conversations on the left; the chat (and later panels) in tabs in
the middle, the chat a model picker over one centred reading column; the gauges on the right, collapsible; the
notices, the banner and the load bar floating over the top of the page; the settings in a dialog; the model's name
in the status bar.

``build_layout(window, store, settings)`` creates them as the window's attributes (``window.chat_view``,
``window.input``, ``window.banner``, …); the window connects them to its controllers. It decides nothing itself.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..attachment_widgets import AttachmentChips
from ..chat_view import ChatView
from ..conversation_list import ConversationList
from ..gauges import GaugesPanel
from ..settings_panel import SettingsPanel
from ..style import READING_WIDTH, set_icon
from ..widgets import Banner, LoadBar, MessageInput, NoticeArea, Overlay
from .settings_dialog import SettingsDialog

EDITING_NOTE = "Editing a message: Enter sends the new version (later messages are replaced); Esc cancels."
NO_MODEL = "Choose a model"  # the picker's words while none is loaded


def build_layout(window, store, settings) -> None:
    window.conversations = ConversationList(store)

    # A tab bar so later panels (the speed lab) sit next to the chat; Settings and the gauges' switch at its end.
    window.tabs = QTabWidget()
    window.tabs.setDocumentMode(True)
    window.tabs.addTab(_chat_area(window), "Chat")
    corner = QWidget()
    ch = QHBoxLayout(corner)
    ch.setContentsMargins(0, 0, 6, 0)
    ch.setSpacing(2)
    window.settings_button = _bar_button("settings")
    window.gauges_button = _bar_button("gauge")
    ch.addWidget(window.settings_button)
    ch.addWidget(window.gauges_button)
    window.tabs.setCornerWidget(corner, Qt.TopRightCorner)
    window.gauges = GaugesPanel()
    window.gauges.hide()  # collapsed until a model is loaded (the window opens it then)

    splitter = QSplitter(Qt.Horizontal)
    splitter.setChildrenCollapsible(False)
    splitter.addWidget(window.conversations)
    splitter.addWidget(window.tabs)
    splitter.addWidget(window.gauges)
    splitter.setStretchFactor(1, 1)
    splitter.setSizes([230, 760, 290])
    window.splitter = splitter

    top = QWidget()
    top.setObjectName("central")
    tv = QVBoxLayout(top)
    tv.setContentsMargins(0, 0, 0, 0)
    tv.addWidget(splitter, 1)
    window.setCentralWidget(top)

    # What comes and goes floats over the page (never in the layout, so nothing under the pointer moves).
    window.overlay = Overlay(top, lambda: _page_rect(window, top))
    window.notices = NoticeArea()  # what stays until dismissed (a settings file or database set aside)
    window.banner = Banner()  # the latest transient message; the next one replaces it
    window.load_bar = LoadBar()
    for w in (window.notices, window.banner, window.load_bar):
        window.overlay.add(w)
    for w in (window.tabs, window.chat_view, splitter):
        window.overlay.follow(w)
    window.tabs.currentChanged.connect(lambda _i: window.overlay.place_later())

    window.settings_panel = SettingsPanel(settings)
    window.settings_dialog = SettingsDialog(window.settings_panel, window)

    window.model_label = ModelLabel(window.model_picker)
    window.statusBar().addPermanentWidget(window.model_label)


def _page_rect(window, top: QWidget) -> QRect:
    """Where the overlay sits: over the chat's transcript, or the top of another tab's page (in ``top``'s
    coordinates)."""
    page = window.chat_view if window.tabs.currentIndex() == 0 else window.tabs.currentWidget()
    if page is None or not page.isVisible():
        page = window.tabs
    return QRect(page.mapTo(top, QPoint(0, 0)), page.size())


def _bar_button(icon: str) -> QToolButton:
    b = QToolButton()
    b.setObjectName("barButton")
    b.setToolButtonStyle(Qt.ToolButtonIconOnly)
    b.setIconSize(QSize(18, 18))
    b.setAutoRaise(True)
    set_icon(b, icon)
    return b


class ModelLabel(QLabel):
    """The status bar's model line; the model picker at the top of the chat says the same."""

    def __init__(self, picker: QToolButton):
        super().__init__("No model loaded")
        self.picker = picker
        self.setText("No model loaded")

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        super().setText(text)
        self.picker.setText(NO_MODEL if text == "No model loaded" else text)
        self.picker.setToolTip(f"{text} — choose, configure or unload the model")


def _column(*widgets: QWidget) -> QHBoxLayout:
    """``widgets`` in the reading column: as wide as the page up to ``READING_WIDTH``, centred."""
    row = QHBoxLayout()
    row.setContentsMargins(12, 0, 12, 0)
    row.addStretch(1)
    box = QVBoxLayout()
    box.setSpacing(6)
    for w in widgets:
        w.setMaximumWidth(READING_WIDTH)
        w.setSizePolicy(QSizePolicy.Expanding, w.sizePolicy().verticalPolicy())
        box.addWidget(w)
    row.addLayout(box, 1000)  # the column takes the width first (up to its maximum), the margins what is left
    row.addStretch(1)
    return row


def _chat_area(window) -> QWidget:
    """The model picker, the system prompt, the transcript, the editing note, the attachments' chips, what the tools
    cost, the message box with the paperclip, the tools' switch, Send and Stop."""
    chat = QWidget()
    chat.setObjectName("chatPage")
    v = QVBoxLayout(chat)
    v.setContentsMargins(0, 8, 0, 10)
    v.setSpacing(6)
    head = QHBoxLayout()
    head.addStretch(1)
    window.model_picker = QToolButton()  # its menu is the Model menu (menus.py)
    window.model_picker.setObjectName("modelPicker")
    window.model_picker.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
    window.model_picker.setPopupMode(QToolButton.InstantPopup)
    window.model_picker.setIconSize(QSize(18, 18))
    set_icon(window.model_picker, "model")
    window.model_picker.setText(NO_MODEL)
    head.addWidget(window.model_picker)
    head.addStretch(1)
    v.addLayout(head)
    window.system_prompt = QLineEdit()
    window.system_prompt.setObjectName("systemPrompt")
    window.system_prompt.setPlaceholderText("System prompt for this conversation (optional, e.g. “Answer briefly.”)")
    v.addLayout(_column(window.system_prompt))
    window.chat_view = ChatView()
    v.addWidget(window.chat_view, 1)
    window.edit_bar = QLabel(EDITING_NOTE)
    window.edit_bar.setObjectName("reloadNote")
    window.edit_bar.setWordWrap(True)
    window.edit_bar.hide()
    composer = QFrame()
    composer.setObjectName("composer")
    row = QHBoxLayout(composer)
    row.setContentsMargins(8, 6, 8, 6)
    window.attach_button = QToolButton()  # the paperclip: documents and images go with the next message
    window.attach_button.setObjectName("attachButton")
    window.attach_button.setText("Attach")  # what a screen reader says; the button shows its icon
    window.attach_button.setAccessibleName("Attach files")
    window.attach_button.setToolTip("Attach documents or images to the message (or drop them here, or paste an image)")
    window.attach_button.setToolButtonStyle(Qt.ToolButtonIconOnly)
    window.attach_button.setIconSize(QSize(18, 18))
    window.attach_button.setAutoRaise(True)
    set_icon(window.attach_button, "attach", "muted")
    row.addWidget(window.attach_button, 0, Qt.AlignBottom)
    window.tools_button = QToolButton()  # tools in this chat, on or off (ui/window/tools_controller.py)
    window.tools_button.setObjectName("toolsButton")
    window.tools_button.setText("Tools")
    window.tools_button.setAccessibleName("Tools in this chat")
    window.tools_button.setToolButtonStyle(Qt.ToolButtonIconOnly)
    window.tools_button.setIconSize(QSize(18, 18))
    window.tools_button.setAutoRaise(True)
    window.tools_button.setCheckable(True)
    set_icon(window.tools_button, "tools", "muted")
    row.addWidget(window.tools_button, 0, Qt.AlignBottom)
    window.input = MessageInput()
    row.addWidget(window.input, 1)
    buttons = QVBoxLayout()
    buttons.setSpacing(6)
    window.send_button = QPushButton("Send")
    window.send_button.setObjectName("sendButton")
    window.send_button.setToolTip("Send the message (Enter)")
    set_icon(window.send_button, "send", "on_accent")
    window.stop_button = QPushButton("Stop")
    window.stop_button.setObjectName("stopButton")
    window.stop_button.setToolTip("Stop the reply (Esc); what was generated is kept")
    set_icon(window.stop_button, "stop", "accent")
    buttons.addStretch(1)
    buttons.addWidget(window.send_button)
    buttons.addWidget(window.stop_button)
    row.addLayout(buttons)
    window.attachment_chips = AttachmentChips()  # what goes with the next message, above the box
    window.tools_note = QLabel()  # "tools: 3 · 1,240 tokens" while tools are on in this chat
    window.tools_note.setObjectName("toolsNote")
    window.tools_note.hide()
    v.addLayout(_column(window.edit_bar, window.attachment_chips, window.tools_note, composer))
    return chat
