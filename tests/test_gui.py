"""The chat window with a tiny random model: streaming, stop, persistence, regenerate, edit, errors."""

import time

import pytest
from budget import within
from gui_helpers import aloop, open_window, profile, send, write_settings  # noqa: F401 - fixtures
from PySide6.QtCore import Qt

pytestmark = pytest.mark.usefixtures("aloop", "profile")


@pytest.fixture
def tiny_window(qtbot, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=24)
    window = open_window(qtbot)
    yield window
    window.shutdown()


def _assistant(window):
    return [m for m in window.store.messages(window.conversation_id) if m.role == "assistant"]


def test_first_start_offers_starter(qtbot):
    window = open_window(qtbot)
    assert window.banner.isVisible() and "starter" in window.banner.label.text()
    assert [b.text() for b in window.banner.buttons()][0] == "Use the starter model"
    assert window.focusWidget() is window.input  # the input gets focus when the window is activated
    window.shutdown()


def test_send_streams_renders_and_saves(qtbot, tiny_window):
    w = tiny_window
    result = send(qtbot, w, "hello there")
    assert result.finish_reason in ("eos", "length") and result.new_tokens > 0
    [user] = [m for m in w.store.messages(w.conversation_id) if m.role == "user"]
    [reply] = _assistant(w)
    assert user.content == "hello there"
    assert reply.content == result.text and not reply.partial
    # The settings leave the strategy to auto: the fastest for fp32 here, said in the status bar.
    strategy = w.models.strategy()
    assert strategy in ("kv", "fast") and w.models.auto_choice.strategy == strategy
    assert w.status.note().startswith(f"auto: {strategy} · fp32 — the fastest strategy for fp32")
    assert reply.stats["new_tokens"] == result.new_tokens and reply.stats["strategy"] == strategy
    assert reply.stats["precision"] == "fp32"
    widgets = w.chat_view.widgets
    assert [x.role for x in widgets] == ["user", "assistant"]
    assert "tokens" in widgets[1].stats_label.text() and strategy in widgets[1].stats_label.text()
    # The gauges got the reply's real figures and a real memory reading.
    assert w.gauges.gauge.value == result.tokens_per_s
    qtbot.waitUntil(lambda: w.gauges.last_snapshot is not None, timeout=5000)
    assert w.gauges.last_snapshot.rss_bytes > 0
    assert "this process (RSS)" in w.gauges.mem_label.text()
    assert w.conversations.list.count() == 1


def test_stop_keeps_partial_reply(qtbot, tiny_window):
    w = tiny_window
    w.apply_settings(__import__("dataclasses").replace(w.settings, max_new_tokens=400))
    w.input.setPlainText("tell me a long story")
    with qtbot.waitSignal(w.reply_finished, timeout=60_000) as blocker:
        w.send()
        qtbot.waitUntil(lambda: w.generation is not None and len(w.generation.text) > 0, timeout=30_000)
        qtbot.keyClick(w.input, Qt.Key_Escape)
    result = blocker.args[0]
    assert result.finish_reason == "cancelled"
    [reply] = _assistant(w)
    assert reply.partial and reply.content and reply.content == result.text
    assert w.chat_view.widgets[-1].badge.text() == "partial"
    assert "stopped" in w.chat_view.widgets[-1].stats_label.text()


def test_regenerate_and_edit_resend(qtbot, tiny_window):
    w = tiny_window
    send(qtbot, w, "first question")
    [old] = _assistant(w)
    with qtbot.waitSignal(w.reply_finished, timeout=60_000):
        w.replies.regenerate(old.id)
    msgs = w.store.messages(w.conversation_id)
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].id != old.id
    w.replies.edit_message(msgs[0].id)
    assert w.input.toPlainText() == "first question" and w.edit_bar.isVisibleTo(w)
    w.input.setPlainText("second question")
    with qtbot.waitSignal(w.reply_finished, timeout=60_000):
        w.send()
    msgs = w.store.messages(w.conversation_id)
    assert [(m.role, m.content if m.role == "user" else "") for m in msgs] == [
        ("user", "second question"),
        ("assistant", ""),
    ]


def test_restart_restores_conversations(qtbot, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=8)
    w = open_window(qtbot)
    send(qtbot, w, "remember me")
    cid = w.conversation_id
    assert w.shutdown()
    w.close()
    again = open_window(qtbot, wait_loaded=False)
    try:
        assert again.conversation_id == cid
        assert [x.role for x in again.chat_view.widgets] == ["user", "assistant"]
        assert again.chat_view.widgets[0].text == "remember me"
        assert again.conversations.list.count() == 1
    finally:
        again.shutdown()


def test_close_mid_reply_saves_partial_and_stops(qtbot, tiny_model_dir):
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=400)
    w = open_window(qtbot)
    w.input.setPlainText("go on forever")
    w.send()
    qtbot.waitUntil(lambda: w.generation is not None and len(w.generation.text) > 0, timeout=30_000)
    mid = w.generation.message_id
    start = time.monotonic()
    w.close()
    assert w.engine.stopped()  # the engine thread stopped inside closeEvent
    assert time.monotonic() - start < within(2.0)
    reply = w.store.message(mid)
    assert reply.partial and reply.content


def test_load_failure_shows_fix_and_keeps_conversation(qtbot, tiny_window, tmp_path):
    import dataclasses

    w = tiny_window
    send(qtbot, w, "keep this")
    cid = w.conversation_id
    broken = tmp_path / "broken"
    broken.mkdir()

    w.apply_settings(dataclasses.replace(w.settings, model=str(broken)))
    qtbot.waitUntil(lambda: w.banner.isVisible() and w.banner.kind == "error", timeout=30_000)
    assert not w.loading and w.loaded is None
    assert "config.json" in w.banner.label.text()
    assert [m.content for m in w.store.messages(cid)][0] == "keep this"
    # Still usable: a message while nothing is loaded stays in the box with a clear note.
    w.input.setPlainText("are you there?")
    w.send()
    qtbot.waitUntil(lambda: "No model is loaded" in w.banner.label.text(), timeout=5000)
    assert w.input.toPlainText() == "are you there?"


def test_message_held_while_loading_is_sent_later_and_the_notice_goes(qtbot, tiny_model_dir):
    import threading

    from redline.app.gui import build_window
    from redline.ui.window.reply_controller import STILL_LOADING

    # Hold the load behind a job on the engine thread until the message has been typed and sent, so the test
    # does not depend on how fast a tiny model loads.
    release = threading.Event()
    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=8, strategy="kv")
    w = build_window()
    qtbot.addWidget(w)
    w.show()
    w.engine.run(lambda engine, report: release.wait(30), label="a test job")
    w.start()
    try:
        qtbot.waitUntil(lambda: w.loading, timeout=5000)
        w.input.setPlainText("held back")
        w.send()  # an async slot: it runs on the next turn of the loop
        qtbot.waitUntil(lambda: w.banner.isVisible() and w.banner.label.text() == STILL_LOADING, timeout=5000)
        assert w.input.toPlainText() == "held back" and w.loading
        release.set()
        qtbot.waitUntil(lambda: w.loaded is not None, timeout=60_000)
        # The load has ended: the banner that held the message back says so no longer, before any send.
        assert not w.banner.isVisible()
        with qtbot.waitSignal(w.reply_finished, timeout=60_000):
            w.send()
        assert not w.banner.isVisible()  # the notice was about this message, which has gone out
        assert [m.content for m in w.store.messages(w.conversation_id)][0] == "held back"
    finally:
        w.shutdown()


def test_a_cancelled_load_says_so_and_only_the_engines_cancel_counts(qtbot):
    """The load's outcome is told apart by its type: the engine's Cancelled is the user's cancel; another
    exception that happens to be called Cancelled (say, from a model's own code) is a failed load."""
    from slow_engine import SlowEngine

    from redline.app.gui import build_window
    from redline.inference import Cancelled

    class ForeignCancelled(Exception):
        pass

    ForeignCancelled.__name__ = "Cancelled"
    raised = [Cancelled(), ForeignCancelled("the model's code gave up")]

    class FailingLoads(SlowEngine):
        def load_all(self, request, report, should_cancel=None):
            raise raised.pop(0)

    write_settings(model="/models/anything", precision="fp32", strategy="kv")
    w = build_window(engine_factory=FailingLoads)
    qtbot.addWidget(w)
    w.show()
    w.start()
    try:
        qtbot.waitUntil(lambda: w.banner.isVisible() and not w.loading, timeout=30_000)
        assert (w.banner.kind, w.banner.label.text()) == ("warning", "Loading was cancelled. No model is loaded.")
        assert w.last_load_error == "Loading was cancelled. No model is loaded." and w.loaded is None
        [again] = [b for b in w.banner.buttons() if b.text() == "Load again"]
        again.click()
        qtbot.waitUntil(lambda: w.banner.isVisible() and w.banner.kind == "error", timeout=30_000)
        assert w.banner.label.text() == "The model could not be loaded: Cancelled: the model's code gave up"
    finally:
        w.shutdown()


def test_corrupt_settings_file_is_reported(qtbot):
    from redline.app.settings import settings_path

    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text("{oops", encoding="utf-8")
    window = open_window(qtbot)
    try:
        [notice] = window.notices.texts()
        assert window.notices.isVisible() and "defaults" in notice
        assert list(settings_path().parent.glob("settings.json.corrupt-*"))
        # The first-start offer is the banner's, beside the notice, not folded into it.
        assert window.banner.isVisible() and window.banner.label.text().startswith("No model is configured yet.")
    finally:
        window.shutdown()


def test_set_aside_files_stay_noticed_while_a_model_loads_until_dismissed(qtbot, tiny_model_dir):
    """`make run` (a --model on the command line) with a truncated settings file and a database of random
    bytes: the loading banner comes and goes, and both notices stay until the user dismisses each."""
    from redline.app.settings import settings_path
    from redline.app.store import default_db_path

    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text('{"model": "starter", "precis', encoding="utf-8")
    default_db_path().parent.mkdir(parents=True, exist_ok=True)
    default_db_path().write_bytes(bytes(range(256)) * 64)
    w = open_window(qtbot, model=str(tiny_model_dir))  # returns once the model has loaded
    try:
        settings_notice, db_notice = w.notices.texts()
        assert (
            settings_notice.startswith("The settings file was unusable") and "settings.json.corrupt-" in settings_notice
        )
        assert db_notice.startswith("The conversation database was unreadable") and ".corrupt-" in db_notice
        assert w.loaded is not None and w.notices.isVisible()
        with qtbot.waitSignal(w.model_loaded, timeout=60_000):
            w.models.load_model()  # a reload hides the banner again; the notices stay
        assert w.notices.texts() == [settings_notice, db_notice]
        first, second = w.notices.notices()
        first.close_button.click()
        assert w.notices.texts() == [db_notice] and w.notices.isVisible()
        second.close_button.click()
        assert w.notices.texts() == [] and not w.notices.isVisible()
    finally:
        w.shutdown()
        w.store.close()


def test_switching_precision_reloads(qtbot, tiny_window):
    import dataclasses

    w = tiny_window
    assert w.loaded.precision == "fp32"
    w.settings_panel.set_settings(w.settings)
    w.settings_panel.precision.setCurrentText("bf16")
    assert "reload" in w.settings_panel.reload_note.text()
    with qtbot.waitSignal(w.model_loaded, timeout=60_000) as blocker:
        w.settings_panel.apply_button.click()
    assert blocker.args[0].precision == "bf16"
    assert "bf16" in w.model_label.text()
    from redline.app.settings import load_settings

    assert load_settings()[0].precision == "bf16"  # persisted
    result = send(qtbot, w, "after the switch")
    assert result.precision == "bf16"
    # A sampling change applies without a reload.
    w.settings_panel.max_new_tokens.setValue(5)
    assert "no reload" in w.settings_panel.reload_note.text()
    loads = []
    w.model_loaded.connect(loads.append)
    w.settings_panel.apply_button.click()
    assert w.settings.max_new_tokens == 5 and not w.loading and not loads
    assert dataclasses.asdict(w.settings)["precision"] == "bf16"


def test_the_status_line_about_auto_follows_settings_strategy_apply(qtbot, tiny_model_dir):
    """Precision and strategy auto, loaded: the status bar says what auto chose. Settings → Strategy → Apply pins
    another strategy (no reload: the precision stays): the line says what runs now, not auto's choice of a strategy
    no longer used; back to auto, auto's line again."""
    import dataclasses

    write_settings(model=str(tiny_model_dir), precision="auto", strategy="auto", temperature=0, max_new_tokens=8)
    w = open_window(qtbot)
    try:
        chosen = w.models.auto_choice
        assert w.status.note() == chosen.reason
        assert chosen.reason.startswith(f"auto: {chosen.strategy} · {chosen.precision} — ")
        other = "kv" if chosen.strategy != "kv" else "naive"
        w.apply_settings(dataclasses.replace(w.settings, strategy=other))
        line = w.status.note()
        assert line.startswith(f"{other} · {chosen.precision} — strategy {other} as set in Settings"), line
        assert w.models.strategy() == other and f"· {other}" in w.model_label.text()
        w.apply_settings(dataclasses.replace(w.settings, strategy="auto"))
        qtbot.waitUntil(lambda: w.status.note().startswith("auto: "), timeout=60_000)
        pinned_all = dataclasses.replace(w.settings, strategy="kv", precision=w.models.loaded.precision)
        w.models.auto_choice = dataclasses.replace(w.models.auto_choice, strategy="fast")
        w.models._settings.value = pinned_all  # nothing auto: no line about it
        w.models.show_status()
        assert w.status.note() == ""
    finally:
        w.shutdown()


def test_the_line_about_auto_outlives_a_menu_and_a_theme_switch(qtbot, tiny_model_dir):
    """The line that says what auto chose stays in the status bar: moving over a menu (whose actions' status tips
    replace the bar's message and then clear it) or switching the theme used to leave the bar empty."""
    from PySide6.QtGui import QStatusTipEvent
    from PySide6.QtWidgets import QApplication, QLabel

    write_settings(model=str(tiny_model_dir), precision="auto", strategy="auto", temperature=0, max_new_tokens=8)
    w = open_window(qtbot)
    try:
        line = w.models.auto_choice.reason
        assert w.status.note() == line
        QApplication.sendEvent(w, QStatusTipEvent("Dark"))  # the pointer over View → Theme → Dark …
        QApplication.sendEvent(w, QStatusTipEvent(""))  # … and off the menu
        w.look.set_theme("dark")
        QApplication.processEvents()
        assert w.status.note() == line and w.status.note_label.isVisible()
        w.status.say("Copied the last reply.", 3000)  # a passing message covers it, then it is back
        assert w.status.message() == "Copied the last reply." and w.status.note() == line
        w.status.clear()
        assert w.status.note_label.isVisible()
        w.resize(700, 500)  # narrower than the line: it ends in "…", the whole line in its tooltip
        QApplication.processEvents()
        label = w.status.note_label
        shown = QLabel.text(label)
        assert shown.endswith("…") and len(shown) < len(line) and label.toolTip() == line and label.text() == line
    finally:
        w.shutdown()
