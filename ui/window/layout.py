"""The main window's widgets and where they sit: conversations on the left, the chat (and later panels) in
tabs in the middle, the gauges on the right; the notices, the banner and the load bar across the top; the
settings in a dock; the model's name in the status bar.

``build_layout(window, store, settings)`` creates them as the window's attributes (``window.chat_view``,
``window.input``, ``window.banner``, …); the window connects them to its controllers. It decides nothing itself.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from redline.ui.chat_view import ChatView
from redline.ui.conversation_list import ConversationList
from redline.ui.gauges import GaugesPanel
from redline.ui.settings_panel import SettingsPanel
from redline.ui.widgets import Banner, LoadBar, MessageInput, NoticeArea

EDITING_NOTE = "Editing a message: Enter sends the new version (later messages are replaced); Esc cancels."


def build_layout(window, store, settings) -> None:
    window.conversations = ConversationList(store)

    # A tab bar so later panels (the speed lab) sit next to the chat.
    window.tabs = QTabWidget()
    window.tabs.setDocumentMode(True)
    window.tabs.addTab(_chat_area(window), "Chat")
    window.gauges = GaugesPanel()

    splitter = QSplitter(Qt.Horizontal)
    splitter.addWidget(window.conversations)
    splitter.addWidget(window.tabs)
    splitter.addWidget(window.gauges)
    splitter.setStretchFactor(1, 1)
    splitter.setSizes([220, 760, 290])

    top = QWidget()
    tv = QVBoxLayout(top)
    tv.setContentsMargins(6, 6, 6, 0)
    tv.setSpacing(4)
    window.notices = NoticeArea()  # what stays until dismissed (a settings file or database set aside)
    window.banner = Banner()  # the latest transient message; the next one replaces it
    window.load_bar = LoadBar()
    tv.addWidget(window.notices)
    tv.addWidget(window.banner)
    tv.addWidget(window.load_bar)
    tv.addWidget(splitter, 1)
    window.setCentralWidget(top)

    window.settings_panel = SettingsPanel(settings)
    window.settings_dock = QDockWidget("Settings", window)
    window.settings_dock.setObjectName("settingsDock")
    # In a scroll area: the form's twenty rows are taller than a 1366×768 laptop screen leaves a window.
    settings_scroll = QScrollArea()
    settings_scroll.setWidgetResizable(True)
    settings_scroll.setFrameShape(QFrame.NoFrame)
    settings_scroll.setWidget(window.settings_panel)
    settings_scroll.setMinimumWidth(window.settings_panel.minimumSizeHint().width() + 16)
    window.settings_dock.setWidget(settings_scroll)
    window.addDockWidget(Qt.RightDockWidgetArea, window.settings_dock)
    window.settings_dock.hide()

    window.model_label = QLabel("No model loaded")
    window.statusBar().addPermanentWidget(window.model_label)


def _chat_area(window) -> QWidget:
    """The system prompt, the transcript, the editing note, the message input with Send and Stop."""
    chat = QWidget()
    v = QVBoxLayout(chat)
    v.setContentsMargins(8, 8, 8, 8)
    sys_row = QHBoxLayout()
    sys_row.addWidget(QLabel("System prompt:"))
    window.system_prompt = QLineEdit()
    window.system_prompt.setPlaceholderText("optional, for this conversation (e.g. “Answer briefly.”)")
    sys_row.addWidget(window.system_prompt, 1)
    v.addLayout(sys_row)
    window.chat_view = ChatView()
    v.addWidget(window.chat_view, 1)
    window.edit_bar = QLabel(EDITING_NOTE)
    window.edit_bar.setObjectName("reloadNote")
    window.edit_bar.hide()
    v.addWidget(window.edit_bar)
    row = QHBoxLayout()
    window.input = MessageInput()
    row.addWidget(window.input, 1)
    buttons = QVBoxLayout()
    window.send_button = QPushButton("Send")
    window.send_button.setObjectName("sendButton")
    window.stop_button = QPushButton("Stop")
    window.stop_button.setObjectName("stopButton")
    window.stop_button.setToolTip("Stop the reply (Esc); what was generated is kept")
    buttons.addWidget(window.send_button)
    buttons.addWidget(window.stop_button)
    row.addLayout(buttons)
    v.addLayout(row)
    return chat
