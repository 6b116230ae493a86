"""Small things in the window that lied or moved (issue 49, item 9): the conversation list re-sorting while a reply
streams, the loaded model's "Last used 28 minutes ago", a remote reply's "remote · server · remote", the Connect
dialog's port, banners pushing the page down as they come and go, and the window left on screen while quitting."""

from __future__ import annotations

import time

import pytest
from gui_helpers import aloop, profile, start_slow_window  # noqa: F401 - fixtures
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def slow_window(qtbot, **engine):
    return start_slow_window(qtbot, engine, (1280, 800), max_new_tokens=engine.get("tokens", 8))


def listed(w) -> list[str]:
    rows = w.conversations.list
    return [rows.item(i).text() for i in range(rows.count())]


def test_a_conversation_moves_up_only_when_its_reply_ends(qtbot):
    w = slow_window(qtbot, interval_s=0.005, tokens=8)
    try:
        for title in ("A", "B", "C"):
            w.new_chat()
            w.input.setPlainText(title)
            with qtbot.waitSignal(w.reply_finished, timeout=30_000):
                w.send()
        assert listed(w) == ["C", "B", "A"]
        w.conversations.list.setCurrentRow(2)  # a click on A
        assert w.conversation_id == w.store.conversations("A")[0].id and listed(w) == ["C", "B", "A"]
        w.apply_settings(__import__("dataclasses").replace(w.settings, max_new_tokens=2000))
        w.engine.service.engine.tokens = 2000  # a long reply, to click around while it streams
        w.input.setPlainText("again")
        w.send()
        qtbot.waitUntil(lambda: w.generation is not None and w.generation.new_tokens > 2, timeout=10_000)
        w.conversations.search.setText("B")  # the list read again from the store while the reply streams
        w.conversations.search.setText("")
        w.conversations.refresh()
        assert listed(w) == ["C", "B", "A"]  # where it was: a click lands on the chat under the pointer
        with qtbot.waitSignal(w.reply_finished, timeout=30_000):
            w.stop()
        assert listed(w) == ["A", "C", "B"]  # its reply ended: now it moves up
        w.conversations.refresh()
        assert listed(w) == ["A", "C", "B"]
    finally:
        w.shutdown()


def test_the_loaded_model_reads_loaded_now_in_the_library(qtbot, tmp_path):
    from redline.inference import LocalModel
    from redline.ui.models.library_page import LOADED_NOW, LibraryPage

    an_hour_ago = time.time() - 3600
    rows = [
        LocalModel("SmolLM2-135M-Instruct", "starter", tmp_path, 1000, an_hour_ago, "starter"),
        LocalModel("other", "hub", tmp_path, 1000, an_hour_ago, "owner/other"),
    ]
    page = LibraryPage([], loaded=("starter", "SmolLM2-135M-Instruct"))
    qtbot.addWidget(page)
    page._show(rows)
    assert page.table.item(0, 3).text() == LOADED_NOW
    assert page.table.item(1, 3).text() == "1 hour ago"


def test_a_remote_reply_says_on_the_server_once(qtbot):
    from redline.ui.chat_view import MessageWidget

    stats = {"new_tokens": 12, "tokens_per_s": 40.0, "ttft_ms": 120, "strategy": "remote", "precision": "server"}
    widget = MessageWidget(1, "assistant", "Hi.", dict(stats, device="remote"))
    qtbot.addWidget(widget)
    line = widget.stats_label.text()
    assert line == "12 tokens · 40.0 tok/s · TTFT 120 ms · on the server"
    assert "remote" not in line and "· server" not in line


def test_connect_offers_redlines_own_server_port(qtbot):
    from redline.inference import DEFAULT_PORT
    from redline.ui.window.connect_dialog import ConnectDialog

    dialog = ConnectDialog(None, None, lambda *a: None)
    qtbot.addWidget(dialog)
    assert dialog.url_edit.text() == f"http://127.0.0.1:{DEFAULT_PORT}/v1" and DEFAULT_PORT == 8642


def geometry(w) -> dict:
    return {
        name: (widget.mapTo(w, QPoint(0, 0)).toTuple(), widget.size().toTuple())
        for name, widget in (
            ("transcript", w.chat_view),
            ("message box", w.input),
            ("Send", w.send_button),
            ("Stop", w.stop_button),
            ("conversations", w.conversations.list),
        )
    }


def test_banners_come_and_go_without_moving_anything(qtbot):
    w = slow_window(qtbot, interval_s=0.005, tokens=8)
    try:
        QApplication.processEvents()
        before = geometry(w)
        w.banner.show_message("The reply failed: the server closed the connection. Your conversation is kept.", "error")
        w.notices.add("The settings file was unusable; defaults are in use. It was kept as settings.json.corrupt.")
        w.load_bar.show()
        for _ in range(3):
            QApplication.processEvents()
        assert w.banner.isVisible() and w.notices.isVisible() and w.load_bar.isVisible()
        assert geometry(w) == before
        top = w.banner.mapTo(w, QPoint(0, 0))
        page = w.chat_view.mapTo(w, QPoint(0, 0))
        assert page.y() <= w.notices.mapTo(w, QPoint(0, 0)).y() < top.y()  # over the page, notices first
        assert w.overlay.width() <= 760 and page.x() <= top.x()  # in the reading column
        w.banner.close_button.click()
        w.load_bar.hide()
        w.notices.dismiss(w.notices.notices()[0])
        QApplication.processEvents()
        assert not w.overlay.isVisible() and geometry(w) == before
    finally:
        w.shutdown()


def test_quitting_takes_the_window_off_the_screen_before_waiting_for_the_engine(qtbot, monkeypatch):
    w = slow_window(qtbot, interval_s=0.01, tokens=2000)
    seen = []
    original = w.engine.shutdown
    monkeypatch.setattr(w.engine, "shutdown", lambda *a, **k: seen.append(w.isVisible()) or original(*a, **k))
    w.input.setPlainText("a long one")
    w.send()
    qtbot.waitUntil(lambda: w.generation is not None and w.generation.new_tokens > 2, timeout=10_000)
    w.close()
    assert seen == [False]
    [_user, reply] = w.store.messages(w.conversation_id)
    assert reply.partial and reply.content  # kept, as before
