"""The window from the keyboard (issue 49, item 8): Ctrl+N from the speed lab shows the new chat; the settings close
with Esc or their own key; Ctrl+Tab / Ctrl+Shift+Tab and Ctrl+PgDown / Ctrl+PgUp switch conversations as browsers
switch tabs; the last reply is copied and regenerated from the keyboard; Help → Keyboard shortcuts lists every key
the window answers, read from its actions. The real window on the slow stand-in engine, keys sent as a user types
them."""

from __future__ import annotations

import pytest
from gui_helpers import aloop, profile, start_slow_window  # noqa: F401 - fixtures
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def slow_window(qtbot):
    return start_slow_window(qtbot, dict(interval_s=0.005, tokens=8), activate=True, max_new_tokens=8)


def tab_title(w) -> str:
    return w.tabs.tabText(w.tabs.currentIndex())


def test_ctrl_n_on_the_speed_lab_shows_the_new_chat(qtbot):
    w = slow_window(qtbot)
    try:
        w.input.setPlainText("hello")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        w.tabs.setCurrentIndex(1)
        assert tab_title(w) == "Speed lab"
        qtbot.keyClick(w.tabs.currentWidget(), Qt.Key_N, Qt.ControlModifier)
        assert tab_title(w) == "Chat" and w.conversation_id is None and w.chat_view.widgets == []
        qtbot.keyClick(w.input, Qt.Key_2, Qt.ControlModifier)  # View → Speed lab
        assert tab_title(w) == "Speed lab"
        qtbot.keyClick(w.tabs.currentWidget(), Qt.Key_1, Qt.ControlModifier)  # View → Chat
        assert tab_title(w) == "Chat"
        # The lab, built by showing it, asks for its rows' predictions: let them come back before the window goes
        # (an answer arriving after it is gone reaches deleted widgets: the lab's, not the keys').
        lab = w.tabs.widget(1).ensure_built()
        qtbot.waitUntil(lambda: not lab.predictions.predicting(), timeout=30_000)
    finally:
        w.shutdown()


def test_the_settings_close_from_the_keyboard(qtbot):
    w = slow_window(qtbot)
    try:
        qtbot.keyClick(w.input, Qt.Key_Comma, Qt.ControlModifier)
        dialog = w.settings_dialog
        assert dialog.isVisible()
        qtbot.waitUntil(lambda: QApplication.activeWindow() is dialog, timeout=2_000)  # it has the keyboard
        qtbot.keyClick(dialog.panel.model, Qt.Key_Escape)  # Esc, with the focus anywhere in it
        assert not dialog.isVisible()
        w.activateWindow()  # the window manager's part: the window under the closed dialog has the keyboard again
        qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=2_000)
        qtbot.keyClick(w.input, Qt.Key_Comma, Qt.ControlModifier)
        assert dialog.isVisible()
        qtbot.waitUntil(lambda: QApplication.activeWindow() is dialog, timeout=2_000)
        qtbot.keyClick(dialog.panel.max_new_tokens, Qt.Key_Comma, Qt.ControlModifier)  # its own key again
        assert not dialog.isVisible()
        assert w.chat_view.width() > 600  # a dialog beside the chat, not a dock squeezing it
    finally:
        w.shutdown()


def test_keys_switch_conversations_as_browsers_switch_tabs(qtbot):
    w = slow_window(qtbot)
    try:
        for title in ("first", "second", "third"):
            w.store.create_conversation(title, "")
        w.conversations.refresh()
        rows = w.conversations.list
        listed = [rows.item(i).data(Qt.UserRole) for i in range(rows.count())]  # newest first
        w.open_conversation(listed[0])
        for key, mod, expected in (
            (Qt.Key_Tab, Qt.ControlModifier, listed[1]),
            (Qt.Key_PageDown, Qt.ControlModifier, listed[2]),
            (Qt.Key_Tab, Qt.ControlModifier, listed[0]),  # round to the top
            (Qt.Key_Backtab, Qt.ControlModifier | Qt.ShiftModifier, listed[2]),
            (Qt.Key_PageUp, Qt.ControlModifier, listed[1]),
        ):
            qtbot.keyClick(w.input, key, mod)
            assert w.conversation_id == expected, QKeySequence(key | mod).toString()
        qtbot.keyClick(w.input, Qt.Key_F, Qt.ControlModifier)  # search the titles
        assert w.conversations.search.hasFocus()
    finally:
        w.shutdown()


def test_the_last_reply_is_copied_and_regenerated_from_the_keyboard(qtbot):
    w = slow_window(qtbot)
    try:
        w.input.setPlainText("hello")
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.send()
        reply = w.store.messages(w.conversation_id)[-1]
        QGuiApplication.clipboard().setText("")
        qtbot.keyClick(w.input, Qt.Key_C, Qt.ControlModifier | Qt.ShiftModifier)
        assert QGuiApplication.clipboard().text() == reply.content and reply.content
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            qtbot.keyClick(w.input, Qt.Key_R, Qt.ControlModifier | Qt.ShiftModifier)
        user, again = w.store.messages(w.conversation_id)
        assert again.id != reply.id and again.role == "assistant"
    finally:
        w.shutdown()


def test_help_lists_every_key_the_window_answers_read_from_its_actions(qtbot):
    w = slow_window(qtbot)
    try:
        qtbot.keyClick(w.input, Qt.Key_F1)
        dialog = w.help.shortcuts_dialog
        assert dialog is not None and dialog.isVisible()
        table = dialog.table
        rows = [tuple(table.item(i, j).text() for j in range(3)) for i in range(table.rowCount())]
        keys = " | ".join(r[0] for r in rows)
        for action in w.findChildren(QAction):  # every action with a key, whatever menu it is in
            for k in action.shortcuts():
                assert k.toString(QKeySequence.NativeText) in keys, action.text()
        does = " | ".join(r[1] for r in rows)
        for words in (
            "Speed lab",
            "Search",
            "Copy the last reply",
            "Regenerate",
            "Next conversation",
            "Settings",
            "Quit",
        ):
            assert words.lower() in does.lower(), words
        assert ("Enter", "Send the message", "message box") in rows
        assert ("Shift+Enter", "A new line in the message", "message box") in rows
    finally:
        w.shutdown()
