"""What a new user tripped on in the window (issue 28, items 4-10): replies queued behind the speed lab, replies
stopped by an unload or a reload, quitting mid-reply, Edit and Regenerate while a reply runs or stops, and the
small lies (an idle Stop button drawn as active, a status line about no model, stale gauge labels). The real
window on the slow stand-in engine (no torch)."""

from __future__ import annotations

import threading
import time

import pytest
from budget import within
from gui_helpers import aloop, profile, start_slow_window, write_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("aloop", "profile")


def slow_window(qtbot, **engine):
    return start_slow_window(qtbot, engine, temperature=0, max_new_tokens=2000)


def start_reply(qtbot, window, text="Tell me everything."):
    window.input.setPlainText(text)
    window.send()
    qtbot.waitUntil(lambda: window.replies.busy_in(window.conversation_id), timeout=5_000)
    return window.replies.current


def shown_text(window) -> str:
    return window.chat_view.widgets[-1].browser.toPlainText()


def test_a_reply_queued_behind_the_speed_lab_stops_at_once_and_leaves_a_saved_line(qtbot):
    w = slow_window(qtbot, interval_s=0.01)
    hold = threading.Event()
    lab = w.engine.run(lambda engine, report: hold.wait(30), label="the speed lab")
    try:
        reply = start_reply(qtbot, w, "first")
        qtbot.waitUntil(lambda: reply.waiting == "waiting for the speed lab", timeout=5_000)
        qtbot.waitUntil(lambda: w.chat_view.widgets[-1].badge.text() == "waiting for the speed lab", timeout=5_000)
        started = time.monotonic()
        with qtbot.waitSignal(w.reply_finished, timeout=2_000):
            w.escape()
        assert time.monotonic() - started < within(1.0)  # not when the lab ends
        why = "Stopped before it started: you stopped it while it was waiting for the speed lab."
        user, line = w.store.messages(w.conversation_id)
        assert (user.content, line.role, line.content, line.stats["notes"]) == ("first", "assistant", "", [why])
        assert shown_text(w) == why  # the bubble stays, saying why
        assert not w.stop_button.isEnabled() and w.send_button.isEnabled()
    finally:
        hold.set()
        qtbot.waitUntil(lambda: lab.done, timeout=10_000)
        w.shutdown()


def test_enter_then_unload_leaves_the_line_and_never_two_user_turns_unexplained(qtbot):
    from redline.ui.chat_session import UNLOAD_NOTE

    w = slow_window(qtbot, prefill_s=2.0)
    try:
        start_reply(qtbot, w, "first")
        qtbot.wait(400)
        with qtbot.waitSignal(w.model_unloaded, timeout=10_000):
            w.unload_model()
        qtbot.waitUntil(lambda: not w.replies.busy(), timeout=5_000)
        user, line = w.store.messages(w.conversation_id)
        assert (line.role, line.content, line.stats["notes"]) == ("assistant", "", [UNLOAD_NOTE])
        qtbot.waitUntil(lambda: shown_text(w) == UNLOAD_NOTE, timeout=5_000)
        assert "No model loaded" in w.model_label.text()
    finally:
        w.shutdown()


def test_a_reload_stops_the_reply_with_the_load_note(qtbot):
    from redline.ui.chat_session import LOAD_NOTE

    w = slow_window(qtbot, interval_s=0.02)
    try:
        reply = start_reply(qtbot, w)
        qtbot.waitUntil(lambda: len(reply.token_times) >= 5, timeout=10_000)
        with qtbot.waitSignal(w.model_loaded, timeout=10_000):
            w.apply_settings(w.settings, force_reload=True)
        qtbot.waitUntil(lambda: not w.replies.busy(), timeout=5_000)
        [line] = [m for m in w.store.messages(w.conversation_id) if m.role == "assistant"]
        assert line.content.startswith("word0 ") and line.stats["notes"] == [LOAD_NOTE]
    finally:
        w.shutdown()


def test_quitting_mid_reply_saves_the_figures_esc_saves(qtbot):
    from redline.ui.chat_session import CLOSED_NOTE

    w = slow_window(qtbot, interval_s=0.02)
    reply = start_reply(qtbot, w)
    qtbot.waitUntil(lambda: len(reply.token_times) >= 20, timeout=10_000)
    w.close()
    [stored] = [m for m in w.store.messages(w.conversation_id) if m.role == "assistant"]
    assert stored.partial and stored.stats["finish_reason"] == "cancelled"
    assert stored.stats["notes"] == [CLOSED_NOTE]
    for key in ("prompt_tokens", "strategy", "precision", "device", "p50_ms", "p95_ms", "total_s", "tokens_per_s"):
        assert stored.stats[key] is not None, key
    n, seconds = stored.stats["new_tokens"], stored.stats["total_s"]
    assert stored.stats["tokens_per_s"] <= n / seconds * 1.5  # the reply's own speed, not a 1-second reading


def test_edit_during_a_reply_says_true_words_and_the_banner_goes_when_it_ends(qtbot):
    from redline.ui.window.reply_controller import EDIT_WHILE_ANSWERING

    w = slow_window(qtbot, interval_s=0.01)
    try:
        start_reply(qtbot, w, "first question")
        user = w.store.messages(w.conversation_id)[0]
        w.replies.edit_message(user.id)
        assert w.banner.label.text() == EDIT_WHILE_ANSWERING and w.banner.isVisible()
        assert "stays in the box" not in w.banner.label.text()  # the box is empty: never say it holds a message
        with qtbot.waitSignal(w.reply_finished, timeout=5_000):
            w.escape()
        assert not w.banner.isVisible()
        # After Esc, Edit waits for the stop and then opens.
        start_reply(qtbot, w, "second question")
        second = [m for m in w.store.messages(w.conversation_id) if m.role == "user"][-1]
        w.escape()
        w.replies.edit_message(second.id)
        qtbot.waitUntil(lambda: not w.replies.busy(), timeout=5_000)
        qtbot.waitUntil(lambda: w.input.toPlainText() == "second question", timeout=2_000)
        assert w.edit_bar.isVisibleTo(w) and w.replies.editing_message_id == second.id
    finally:
        w.shutdown()


def test_regenerate_while_a_stop_is_pending_runs_the_last_click(qtbot):
    w = slow_window(qtbot, interval_s=0.01)
    try:
        reply = start_reply(qtbot, w)
        qtbot.waitUntil(lambda: len(reply.token_times) >= 3, timeout=5_000)
        for _ in range(5):
            running = w.replies.current
            assert running is not None
            w.escape()
            assert w.stop_button.text() == "Stopping…" and not w.stop_button.isEnabled()
            w.replies.regenerate(running.message_id)
            qtbot.waitUntil(lambda r=running: w.replies.current not in (None, r), timeout=5_000)
        last = w.replies.current
        qtbot.waitUntil(lambda: len(last.token_times) >= 30, timeout=10_000)  # it runs: not a 1-token "stopped"
        assert not last.stopping
    finally:
        w.shutdown()


def _reddish(image) -> int:
    """How many pixels of a grab are the Stop button's red text."""
    count = 0
    for y in range(0, image.height(), 1):
        for x in range(0, image.width(), 1):
            c = image.pixelColor(x, y)
            if c.red() > 150 and c.green() < 90 and c.blue() < 100:
                count += 1
    return count


def test_an_idle_stop_button_is_not_drawn_as_active_and_no_model_means_no_auto_line(qtbot):
    from redline.app.gui import build_window

    write_settings(model="", precision="auto", strategy="auto")
    w = build_window()
    qtbot.addWidget(w)
    w.show()
    try:
        assert not w.stop_button.isEnabled()
        assert _reddish(w.stop_button.grab().toImage()) == 0
        w.stop_button.setEnabled(True)  # as while a reply runs: red
        assert _reddish(w.stop_button.grab().toImage()) > 0
        w.stop_button.setEnabled(False)
        w.models.auto_note = "auto: fast · q8 — fastest that fits"
        w.status.set_note(w.models.auto_note)
        w.models.show_status()
        assert w.status.note() == "" and w.model_label.text() == "No model loaded"
    finally:
        w.shutdown()


def test_the_gauges_name_and_measure_the_chat_after_a_lab_row(qtbot):
    from redline.ui.speedlab.link import follow_speed_lab

    w = slow_window(qtbot, interval_s=0.01)
    try:
        from PySide6.QtCore import QObject, Signal

        class FakeLab(QObject):
            row_started = Signal(str)
            live_speed = Signal(float, object, int)
            row_done = Signal(object)
            token_latencies = Signal(list)

        lab = FakeLab()
        follow_speed_lab(w, lab)
        lab.row_started.emit("fast:q8")

        class Row:
            status, config = "cancelled", "fast:q8"

        lab.row_done.emit(Row())
        assert "speed lab" in w.gauges.source_label.text()
        w.gauges.finish_reply(9.0, 100.0, 10, 11.0, 15.0, source="")
        reply = start_reply(qtbot, w)
        qtbot.waitUntil(lambda: w.gauges.rate_updates > 0 and len(reply.token_times) > 2, timeout=5_000)
        assert not w.gauges.source_label.isVisible()
        assert "11.0" not in w.gauges.latency_label.text()  # never the previous reply's p50 under this one
    finally:
        w.shutdown()


def test_quitting_leaves_at_once_once_everything_is_saved(qtbot, monkeypatch):
    """Python's own finalisation after the window closed took 3.4-5.7 s with the starter loaded
    (tools/benchmarks/quit_time.py): the app leaves with os._exit once the replies are saved and the store is closed."""
    import redline.app.gui as gui

    w = slow_window(qtbot, interval_s=0.02)
    reply = start_reply(qtbot, w)
    qtbot.waitUntil(lambda: len(reply.token_times) >= 3, timeout=10_000)
    steps = []
    close_store = w.store.close
    monkeypatch.setattr(w.store, "close", lambda: (steps.append("store closed"), close_store()))

    class Left(Exception):
        pass

    def leave(code):
        steps.append(("exit", code))
        raise Left

    monkeypatch.setattr(gui.os, "_exit", leave)
    w.close()
    with pytest.raises(Left):
        gui.finish_quit(w)
    assert steps == ["store closed", ("exit", 0)]
    from redline.app.store import Store

    store = Store(w.store.path)
    try:
        [saved] = [m for m in store.messages(w.conversation_id) if m.role == "assistant"]
        assert saved.content.startswith("word0 ") and saved.stats["finish_reason"] == "cancelled"
    finally:
        store.close()
