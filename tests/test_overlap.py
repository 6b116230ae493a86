"""When actions overlap in the window: quitting mid-prefill, Stop during a long prefill, the speed lab beside a
chat, a message during an unload, two chats replying at once."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from budget import within
from gui_helpers import aloop, profile, send, start_slow_window, write_settings  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("aloop", "profile")
ROOT = Path(__file__).resolve().parents[1]


def slow_window(qtbot, **engine):
    """The real window on the slow stand-in engine (no torch): deterministic timing."""
    return start_slow_window(qtbot, engine, temperature=0, max_new_tokens=2000)


def start_reply(qtbot, window, text="Tell me everything."):
    window.input.setPlainText(text)
    window.send()
    qtbot.waitUntil(lambda: window.replies.busy_in(window.conversation_id), timeout=5_000)
    return window.replies.current


def test_stop_during_a_long_prefill_takes_effect_within_a_second(qtbot):
    w = slow_window(qtbot, prefill_s=60)
    try:
        start_reply(qtbot, w)
        qtbot.wait(300)  # the engine is reading the prompt now
        with qtbot.waitSignal(w.reply_finished, timeout=5_000) as blocker:
            started = time.monotonic()
            w.escape()
        assert time.monotonic() - started < within(1.0)
        result = blocker.args[0]
        assert result.finish_reason == "cancelled" and result.new_tokens == 0
        # No word was written, and the conversation says why instead of silently dropping the reply.
        user, line = w.store.messages(w.conversation_id)
        assert (user.role, line.role, line.content) == ("user", "assistant", "")
        assert line.stats["notes"] == ["Stopped before it started: you stopped it before its first word."]
        assert w.chat_view.widgets[-1].browser.toPlainText() == line.stats["notes"][0]
    finally:
        w.shutdown()


def test_quitting_during_a_prefill_stops_cleanly_and_keeps_the_conversation(qtbot):
    w = slow_window(qtbot, prefill_s=60)
    start_reply(qtbot, w, "A long question")
    qtbot.wait(300)
    started = time.monotonic()
    w.close()
    assert w.engine.stopped() and time.monotonic() - started < within(2.0)
    assert w.shutdown() is True  # the app's second call answers what closing found
    user, line = w.store.messages(w.conversation_id)
    assert (user.role, user.content, line.content) == ("user", "A long question", "")
    assert line.stats["notes"] == ["Stopped because Redline was closed."]


def test_quitting_mid_reply_keeps_the_partial_with_its_figures(qtbot):
    w = slow_window(qtbot, interval_s=0.02)
    reply = start_reply(qtbot, w)
    qtbot.waitUntil(lambda: len(reply.text.split()) >= 10, timeout=10_000)
    w.close()
    [stored] = [m for m in w.store.messages(w.conversation_id) if m.role == "assistant"]
    assert stored.partial and stored.content.startswith("word0 ")
    assert stored.stats["finish_reason"] == "cancelled" and stored.stats.get("new_tokens")


@pytest.mark.slow
def test_the_app_exits_with_code_0_when_quit_during_a_prefill(tmp_path):
    """The crash of old (exit 134, "QThread: Destroyed while thread is still running") does not come back."""
    import os

    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        REDLINE_TEST_PREFILL_S="60",
        REDLINE_TEST_QUIT_AFTER_MS="1500",
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    (tmp_path / "config" / "redline").mkdir(parents=True)
    (tmp_path / "config" / "redline" / "settings.json").write_text('{"model": "fake", "max_new_tokens": 50}')
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "app_child.py"), "hello"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Destroyed while thread" not in proc.stderr


def test_a_message_sent_while_the_model_unloads_is_refused_before_it_is_saved(qtbot):
    import threading

    w = slow_window(qtbot)
    hold = threading.Event()
    try:
        w.new_chat()
        w.engine.run(lambda engine, report: hold.wait(30))  # keeps the unload waiting its turn
        w.models.unload_model()
        qtbot.waitUntil(lambda: w.models.unloading, timeout=5_000)
        w.input.setPlainText("are you there?")
        w.send()
        qtbot.waitUntil(lambda: "being unloaded" in w.banner.label.text(), timeout=5_000)
        assert w.input.message_text() == "are you there?"  # the text stays in the box
        assert w.conversation_id is None or not w.store.messages(w.conversation_id)
    finally:
        hold.set()
        w.shutdown()


def test_two_chats_reply_at_once_and_stopping_one_leaves_the_other(qtbot, tiny_model_dir, monkeypatch):
    """On the fast path the engine decodes both replies together (continuous batching)."""
    import time

    from redline.app.gui import build_window
    from redline.inference.generation.batch import Batcher

    step = Batcher.step

    def paced(self):  # the tiny model writes 400 tokens in well under a second: slow it to a pace a chat has
        time.sleep(0.01)
        step(self)

    monkeypatch.setattr(Batcher, "step", paced)

    write_settings(
        model=str(tiny_model_dir),
        precision="fp32",
        temperature=0,
        max_new_tokens=400,
        strategy="fast",
        context_length=512,
    )
    w = build_window()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=120_000):
        w.start()
    try:
        first = start_reply(qtbot, w, "first chat")
        first_chat = w.conversation_id
        w.new_chat()
        second = start_reply(qtbot, w, "second chat")
        assert w.conversation_id != first_chat
        qtbot.waitUntil(lambda: w.engine.status()["active"] == 2, timeout=30_000)  # decoded together
        finished = []
        w.reply_finished.connect(finished.append)
        w.stop()  # the chat on screen: the second
        qtbot.waitUntil(lambda: first.finished and second.finished, timeout=120_000)
        by_reply = {r.finish_reason for r in finished if r is not None}
        assert "cancelled" in by_reply and by_reply & {"length", "eos"}  # one stopped, the other ended on its own
        stored = [m for m in w.store.messages(first_chat) if m.role == "assistant"]
        assert stored and not stored[0].partial
    finally:
        w.shutdown()


def test_the_speed_lab_and_a_chat_never_cancel_each_other(qtbot, tiny_model_dir):
    """Lab Cancel never touches a chat reply; chat Stop never touches a lab run; and each says it waits."""
    import threading

    from redline.app.gui import build_window

    write_settings(model=str(tiny_model_dir), precision="fp32", temperature=0, max_new_tokens=40, strategy="kv")
    w = build_window()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=120_000):
        w.start()
    hold = threading.Event()
    try:
        w.tabs.setCurrentIndex(1)  # build the lab's tab
        panel = w.tabs.currentWidget().ensure_built()
        panel.model_edit.setText(str(tiny_model_dir))
        panel.configs_edit.setText("kv:fp32")
        panel.new_tokens_spin.setValue(8)
        panel.warmup_spin.setValue(0)
        panel.samples_spin.setValue(1)
        w.tabs.setCurrentIndex(0)

        # 1. A chat reply and a lab run wait behind a job that holds the engine; the lab's Cancel …
        w.engine.run(lambda engine, report: hold.wait(60), label="a test job")
        reply = start_reply(qtbot, w, "first question")
        assert panel.start() is not None
        qtbot.waitUntil(lambda: "Waiting to start" in panel.status_label.text(), timeout=10_000)
        qtbot.waitUntil(lambda: reply.waiting != "", timeout=10_000)  # the reply says it waits, too
        panel.cancel()
        finished = []
        w.reply_finished.connect(finished.append)
        hold.set()
        qtbot.waitUntil(lambda: not panel.running() and reply.finished, timeout=120_000)
        assert finished[0].finish_reason in ("length", "eos")  # … never touched the chat's reply

        # 2. The other way: a chat reply queued behind a lab run, stopped, leaves the run alone.
        hold.clear()
        w.engine.run(lambda engine, report: hold.wait(60), label="a test job")
        with qtbot.waitSignal(panel.run_finished, timeout=300_000) as run:
            panel.start()
            second = start_reply(qtbot, w, "second question")
            w.stop()
            hold.set()
        assert not run.args[0].cancelled and run.args[0].results[0].status == "ok"
        qtbot.waitUntil(lambda: second.finished, timeout=60_000)
    finally:
        hold.set()
        w.shutdown()
