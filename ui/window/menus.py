"""The main window's menu bar (File, Chat, View, Model, Server, Help): every key the window answers is an action
here, so Help → Keyboard shortcuts lists them from the actions themselves and cannot drift from them.

``build_menus(window)`` creates the menus and the actions tests and tools use (``window.new_action``,
``window.model_menu``, ``window.wizard_action``, ``window.presets_menu``, ``window.serve_action``,
``window.about_action``, ``window.settings_action``, ``window.gauges_action``, …); each action calls the part of
the window that does the work.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication, QKeySequence

from ..models.dialog import open_model_browser
from ..settings_panel import THEME_LABELS
from . import export

LAB = "Speed lab"  # the tab app/gui.py adds


def build_menus(window) -> None:
    models, chats, server = window.models, window.chats, window.server
    mb = window.menuBar()
    file_menu = mb.addMenu("&File")
    window.new_action = add_action(window, file_menu, "&New chat", window.new_chat, "Ctrl+N")
    file_menu.addSeparator()
    for text, kind in (("Export as &Markdown…", "md"), ("Export as &JSON…", "json")):
        add_action(
            window,
            file_menu,
            text,
            lambda k=kind: export.export(window, window.store, chats.conversation_id, window.banner, window.status, k),
        )
    file_menu.addSeparator()
    add_action(window, file_menu, "&Quit", window.close, "Ctrl+Q")

    chat_menu = mb.addMenu("&Chat")
    window.stop_action = add_action(
        window, chat_menu, "&Stop the reply, cancel a load or leave editing", window.escape, Qt.Key_Escape
    )
    window.copy_action = add_action(
        window, chat_menu, "&Copy the last reply", lambda: copy_last_reply(window), "Ctrl+Shift+C"
    )
    window.regenerate_action = add_action(
        window, chat_menu, "&Regenerate the last reply", lambda: regenerate_last_reply(window), "Ctrl+Shift+R"
    )
    chat_menu.addSeparator()
    # As browsers switch tabs: Ctrl+Tab / Ctrl+PgDown go down the list, with Shift / PgUp up it.
    window.next_chat_action = add_action(
        window, chat_menu, "&Next conversation", lambda: step_conversation(window, 1), ("Ctrl+Tab", "Ctrl+PgDown")
    )
    window.previous_chat_action = add_action(
        window,
        chat_menu,
        "&Previous conversation",
        lambda: step_conversation(window, -1),
        ("Ctrl+Shift+Tab", "Ctrl+PgUp"),
    )
    window.search_action = add_action(
        window, chat_menu, "Sear&ch conversations", lambda: search_conversations(window), "Ctrl+F"
    )

    view_menu = mb.addMenu("&View")
    window.chat_tab_action = add_action(window, view_menu, "&Chat", lambda: show_tab(window, "Chat"), "Ctrl+1")
    window.lab_action = add_action(window, view_menu, "&Speed lab", lambda: show_tab(window, LAB), "Ctrl+2")
    view_menu.addSeparator()
    window.gauges_action = add_action(
        window, view_menu, "&Gauges", lambda: window.look.set_gauges(window.gauges_action.isChecked()), "Ctrl+G"
    )
    window.gauges_action.setCheckable(True)
    window.gauges_action.setChecked(window.gauges.isVisibleTo(window))
    window.gauges_action.setToolTip("Show or hide the gauges: speed, time to first token, latency, memory (Ctrl+G)")
    window.gauges_button.setToolTip(window.gauges_action.toolTip())
    window.gauges_button.setCheckable(True)
    window.gauges_button.setChecked(window.gauges_action.isChecked())
    window.gauges_button.clicked.connect(lambda _checked: window.gauges_action.trigger())
    window.gauges_action.toggled.connect(window.gauges_button.setChecked)
    theme_menu = view_menu.addMenu("&Theme")
    group = QActionGroup(window)
    window.theme_actions = {}
    for key, label in THEME_LABELS.items():
        action = QAction(label, window, checkable=True)
        action.setData(key)
        action.setChecked(key == window.look.choice)
        action.triggered.connect(lambda _checked=False, k=key: window.look.set_theme(k))
        group.addAction(action)
        theme_menu.addAction(action)
        window.theme_actions[key] = action

    window.model_menu = mb.addMenu("&Model")
    window.wizard_action = add_action(
        window, window.model_menu, "&Configure model…", window.open_wizard, "Ctrl+Shift+M"
    )
    add_action(window, window.model_menu, "&Find a model…", lambda: open_model_browser(window))
    window.presets_menu = window.model_menu.addMenu("&Presets")
    window.preset_actions.menu = window.presets_menu
    window.presets_menu.aboutToShow.connect(window.preset_actions.fill_menu)
    window.preset_actions.fill_menu()
    window.model_menu.addSeparator()
    window.settings_action = add_action(window, window.model_menu, "&Settings…", window.toggle_settings, "Ctrl+,")
    window.settings_action.setToolTip("Settings: model, precision, strategy, sampling, theme (Ctrl+,)")
    window.settings_button.setToolTip(window.settings_action.toolTip())
    window.settings_button.clicked.connect(window.settings_action.trigger)
    window.settings_dialog.addAction(window.settings_action)  # the same key closes it from inside
    add_action(window, window.model_menu, "&Reload model", lambda: models.load_model())
    add_action(window, window.model_menu, "&Unload model (free its memory)", lambda: models.unload_model())
    add_action(window, window.model_menu, "Use the &starter model", models.use_starter)
    window.model_menu.addSeparator()
    window.connect_action = add_action(window, window.model_menu, "Connect to a ser&ver…", models.connect_dialog)
    window.model_picker.setMenu(window.model_menu)  # the picker at the top of the chat: the same actions

    server_menu = mb.addMenu("Ser&ver")
    window.server_menu = server_menu
    window.serve_action = QAction("&Serve the model (OpenAI-compatible API)", window)
    window.serve_action.setCheckable(True)
    window.serve_action.triggered.connect(lambda checked: server.set_serving(checked))
    server.serve_action = window.serve_action
    server_menu.addAction(window.serve_action)
    add_action(window, server_menu, "Server &settings…", server.edit_settings)
    add_action(window, server_menu, "&Copy the server's address", server.copy_address)
    help_menu = mb.addMenu("&Help")
    window.shortcuts_action = add_action(window, help_menu, "&Keyboard shortcuts", window.help.shortcuts, "F1")
    help_menu.addSeparator()
    window.about_action = add_action(window, help_menu, "&About Redline", window.help.show_about)


def add_action(window, menu, text, slot, shortcut=None) -> QAction:
    """An action in ``menu`` (also the window's, so its key works while the menu bar is hidden); ``shortcut``: a key
    ("Ctrl+N": Qt reads Ctrl as Cmd on macOS; written out rather than a platform's standard key, which some
    platforms leave unbound, e.g. Quit), or several keys as a tuple (the first is shown in the menu)."""
    action = QAction(text, window)
    if isinstance(shortcut, tuple):
        action.setShortcuts([QKeySequence(k) for k in shortcut])
    elif shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    window.addAction(action)
    return action


# -- what the keys do ---------------------------------------------------------------------------------------------
def show_tab(window, title: str) -> None:
    titles = [window.tabs.tabText(i) for i in range(window.tabs.count())]
    if title in titles:
        window.tabs.setCurrentIndex(titles.index(title))


def step_conversation(window, step: int) -> None:
    """The next (``step`` 1) or previous (-1) conversation in the list, as shown (newest first)."""
    rows = window.conversations.list
    if rows.count() == 0:
        return
    row = rows.currentRow()
    target = (0 if step > 0 else rows.count() - 1) if row < 0 else (row + step) % rows.count()
    rows.setCurrentRow(target)


def search_conversations(window) -> None:
    box = window.conversations.search
    box.setFocus(Qt.ShortcutFocusReason)
    box.selectAll()


def _last_reply(window):
    """The open conversation's last message, if it is a reply."""
    cid = window.conversation_id
    last = window.store.messages(cid, limit=1) if cid is not None else []
    return last[-1] if last and last[-1].role == "assistant" else None


def copy_last_reply(window) -> Optional[str]:
    """What the reply's Copy button copies (text as Markdown, tool calls as JSON); said in the status bar."""
    m = _last_reply(window)
    if m is None:
        window.status.say("No reply to copy in this conversation.", 4000)
        return None
    widget = window.chat_view.widget_for(m.id)
    if widget is not None:
        widget.copy_text()
    else:
        QGuiApplication.clipboard().setText(m.content)
    window.status.say("Copied the last reply.", 3000)
    return QGuiApplication.clipboard().text()


def regenerate_last_reply(window) -> None:
    m = _last_reply(window)
    if m is None:
        window.status.say("No reply to regenerate in this conversation.", 4000)
        return
    window.replies.regenerate(m.id)
