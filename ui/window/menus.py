"""The main window's menu bar (File, Model, Server, Help) and its window-wide shortcut (Esc).

``build_menus(window)`` creates the menus and the actions tests and tools use (``window.new_action``,
``window.model_menu``, ``window.wizard_action``, ``window.presets_menu``, ``window.serve_action``,
``window.about_action``); each action calls the part of the window that does the work.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut

from redline.ui.models.dialog import open_model_browser
from redline.ui.window import export


def build_menus(window) -> None:
    models, chats, server = window.models, window.chats, window.server
    mb = window.menuBar()
    file_menu = mb.addMenu("&File")
    window.new_action = add_action(window, file_menu, "&New chat", chats.new_chat, QKeySequence.New)
    file_menu.addSeparator()
    for text, kind in (("Export as &Markdown…", "md"), ("Export as &JSON…", "json")):
        add_action(
            window,
            file_menu,
            text,
            lambda k=kind: export.export(window, window.store, chats.conversation_id, window.banner, window.status, k),
        )
    file_menu.addSeparator()
    add_action(window, file_menu, "&Quit", window.close, QKeySequence.Quit)
    window.model_menu = mb.addMenu("&Model")
    window.wizard_action = add_action(
        window, window.model_menu, "&Configure model…", window.open_wizard, QKeySequence("Ctrl+Shift+M")
    )
    add_action(window, window.model_menu, "&Find a model…", lambda: open_model_browser(window))
    window.presets_menu = window.model_menu.addMenu("&Presets")
    window.preset_actions.menu = window.presets_menu
    window.presets_menu.aboutToShow.connect(window.preset_actions.fill_menu)
    window.preset_actions.fill_menu()
    window.model_menu.addSeparator()
    add_action(window, window.model_menu, "&Settings…", window.show_settings, QKeySequence("Ctrl+,"))
    add_action(window, window.model_menu, "&Reload model", lambda: models.load_model())
    add_action(window, window.model_menu, "&Unload model (free its memory)", lambda: models.unload_model())
    add_action(window, window.model_menu, "Use the &starter model", models.use_starter)
    window.model_menu.addSeparator()
    window.connect_action = add_action(window, window.model_menu, "Connect to a ser&ver…", models.connect_dialog)
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
    add_action(window, help_menu, "&Keyboard shortcuts", window.help.shortcuts)
    help_menu.addSeparator()
    window.about_action = add_action(window, help_menu, "&About Redline", window.help.show_about)
    QShortcut(QKeySequence(Qt.Key_Escape), window, window.escape, context=Qt.WindowShortcut)


def add_action(window, menu, text, slot, shortcut=None) -> QAction:
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(shortcut)
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    return action
