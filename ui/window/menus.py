"""The main window's menu bar (File, Model, Help) and its window-wide shortcut (Esc).

``build_menus(window)`` creates the menus and the actions tests and tools use (``window.new_action``,
``window.model_menu``, ``window.wizard_action``, ``window.presets_menu``, ``window.about_action``); every
action calls a method of the window.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut


def build_menus(window) -> None:
    mb = window.menuBar()
    file_menu = mb.addMenu("&File")
    window.new_action = add_action(window, file_menu, "&New chat", window.new_chat, QKeySequence.New)
    file_menu.addSeparator()
    add_action(window, file_menu, "Export as &Markdown…", lambda: window.export("md"))
    add_action(window, file_menu, "Export as &JSON…", lambda: window.export("json"))
    file_menu.addSeparator()
    add_action(window, file_menu, "&Quit", window.close, QKeySequence.Quit)
    window.model_menu = mb.addMenu("&Model")
    window.wizard_action = add_action(
        window, window.model_menu, "&Configure model…", window.open_wizard, QKeySequence("Ctrl+Shift+M")
    )
    window.presets_menu = window.model_menu.addMenu("&Presets")
    window.presets_menu.aboutToShow.connect(window.preset_actions.fill_menu)
    window.preset_actions.fill_menu()
    window.model_menu.addSeparator()
    add_action(window, window.model_menu, "&Settings…", window.show_settings, QKeySequence("Ctrl+,"))
    add_action(window, window.model_menu, "&Reload model", lambda: window.load_model())
    add_action(window, window.model_menu, "&Unload model (free its memory)", lambda: window.unload_model())
    add_action(window, window.model_menu, "Use the &starter model", window.use_starter)
    window.model_menu.addSeparator()
    window.connect_action = add_action(window, window.model_menu, "Connect to a ser&ver…", window.connect_to_server)
    server_menu = mb.addMenu("Ser&ver")
    window.server_menu = server_menu
    window.serve_action = QAction("&Serve the model (OpenAI-compatible API)", window)
    window.serve_action.setCheckable(True)
    window.serve_action.triggered.connect(lambda checked: window.set_serving(checked))
    server_menu.addAction(window.serve_action)
    add_action(window, server_menu, "Server &settings…", window.server.edit_settings)
    add_action(window, server_menu, "&Copy the server's address", window.server.copy_address)
    help_menu = mb.addMenu("&Help")
    add_action(window, help_menu, "&Keyboard shortcuts", window.help.shortcuts)
    help_menu.addSeparator()
    window.about_action = add_action(window, help_menu, "&About Redline", window.show_about)
    QShortcut(QKeySequence(Qt.Key_Escape), window, window.escape, context=Qt.WindowShortcut)


def add_action(window, menu, text, slot, shortcut=None) -> QAction:
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(shortcut)
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    return action
