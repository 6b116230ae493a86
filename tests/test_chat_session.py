"""A conversation's replies without a window: a ``ChatSession`` over a real store and an ``EngineBridge`` on the
slow stand-in engine (no torch). What the window shows is what the session says; these check what it says and
what it writes."""

from __future__ import annotations

import threading

import pytest
from gui_helpers import aloop  # noqa: F401 - fixture
from slow_engine import SlowEngine

from redline.app.store import Store
from redline.inference import DecodeOptions, SamplingSettings
from redline.ui.bridge import EngineBridge
from redline.ui.chat_session import CLOSED_NOTE, ChatSession, ReplyConfig, prompt_messages


@pytest.fixture
def bridge(qtbot):
    bridge = EngineBridge(lambda: SlowEngine(interval_s=0.01))
    loaded = bridge.load("fake", "fp32")
    qtbot.waitUntil(lambda: loaded.done, timeout=10_000)
    yield bridge
    bridge.shutdown(5000)


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "chat.sqlite3")
    yield store
    store.close()


def config(max_new_tokens=20) -> ReplyConfig:
    return ReplyConfig(
        "slow-fake", SamplingSettings(max_new_tokens=max_new_tokens), DecodeOptions(strategy="kv"), None, "fp32", "cpu"
    )


def test_a_session_writes_the_turn_streams_the_reply_and_saves_its_figures(qtbot, bridge, store):
    conv = store.create_conversation("t")
    session = ChatSession(store, bridge, conv.id)
    said = {"grew": 0, "live": 0, "latencies": []}
    session.grew.connect(lambda r: said.__setitem__("grew", said["grew"] + 1))
    session.live.connect(lambda r: said.__setitem__("live", said["live"] + 1))
    session.latencies.connect(said["latencies"].extend)
    with qtbot.waitSignal(session.reply_finished, timeout=10_000) as ended:
        reply = session.send("hello", config())
        assert session.busy and store.message(reply.message_id).stats["finish_reason"] == "interrupted"
    assert ended.args[0] is reply and not session.busy
    user, answer = store.messages(conv.id)
    assert (user.role, user.content) == ("user", "hello")
    assert answer.content == reply.text == "".join(f"word{i} " for i in range(20)) and not answer.partial
    assert answer.stats["finish_reason"] == "length" and answer.stats["new_tokens"] == 20
    assert said["grew"] > 0 and said["live"] > 0 and len(said["latencies"]) == 19


def test_a_reply_stopped_while_it_waits_ends_at_once_and_leaves_a_line(qtbot, bridge, store):
    """Queued behind a job that holds the engine (as behind the speed lab): Stop ends it now, and the
    conversation keeps a line saying why; the next message is sent after it, never two user turns unexplained."""
    hold = threading.Event()
    bridge.run(lambda engine, report: hold.wait(30), label="the speed lab")
    conv = store.create_conversation("t")
    session = ChatSession(store, bridge, conv.id)
    try:
        reply = session.send("first", config())
        qtbot.waitUntil(lambda: reply.waiting == "waiting for the speed lab", timeout=5000)
        with qtbot.waitSignal(session.reply_finished, timeout=2000):
            session.stop()
        line = store.message(reply.message_id)
        assert line.content == "" and line.partial and line.stats["finish_reason"] == "cancelled"
        why = "Stopped before it started: you stopped it while it was waiting for the speed lab."
        assert line.stats["notes"] == [why]
        assert line.stats["prompt_tokens"] is None  # never read: unknown, not zero
        session.send("second", config())
        roles = [(m.role, m.content) for m in store.messages(conv.id)]
        assert roles[:3] == [("user", "first"), ("assistant", ""), ("user", "second")]
        # The engine reads the two messages as one turn (a chat template may refuse two user turns in a row).
        assert prompt_messages(store, conv.id) == [{"role": "user", "content": "first\n\nsecond"}]
    finally:
        hold.set()
        qtbot.waitUntil(lambda: not session.busy, timeout=10_000)


def test_closing_saves_the_engines_figures_and_the_note(qtbot, bridge, store):
    conv = store.create_conversation("t")
    session = ChatSession(store, bridge, conv.id)
    reply = session.send("go on", config(2000))
    qtbot.waitUntil(lambda: len(reply.token_times) >= 10, timeout=10_000)
    session.stop(CLOSED_NOTE)
    assert bridge.shutdown(5000)
    bridge.flush()
    session.close()
    saved = store.message(reply.message_id)
    assert saved.partial and saved.content.startswith("word0 ") and saved.stats["finish_reason"] == "cancelled"
    assert saved.stats["notes"] == [CLOSED_NOTE]
    for key in ("prompt_tokens", "strategy", "precision", "device", "p50_ms", "p95_ms", "total_s", "tokens_per_s"):
        assert saved.stats[key] is not None, key
    n, seconds = saved.stats["new_tokens"], saved.stats["total_s"]
    assert saved.stats["tokens_per_s"] <= n / (seconds * 0.5)  # the reply's own speed, not a gauge's reading


def test_a_reply_that_waited_shows_and_saves_its_wait_apart_from_its_ttft(qtbot, bridge, store):
    """Queued behind the speed lab, a reply's wait is not its TTFT: the line under it says "waited … for the speed
    lab · TTFT …", the wait is stored with its figures, and the TTFT stored is its own (counted from its start)."""
    from redline.ui.chat_view import MessageWidget, format_stats

    hold = threading.Event()
    bridge.run(lambda engine, report: hold.wait(30), label="the speed lab")
    conv = store.create_conversation("t")
    session = ChatSession(store, bridge, conv.id)
    reply = session.send("first", config(5))
    qtbot.waitUntil(lambda: reply.waiting == "waiting for the speed lab", timeout=5000)
    qtbot.wait(1200)
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        hold.set()
    saved = store.message(reply.message_id).stats
    assert saved["queued_ms"] >= 1000 and saved["waited_for"] == "the speed lab"
    assert saved["ttft_ms"] < saved["queued_ms"]  # its own: the stand-in's first word comes 10 ms after its start
    line = format_stats(saved)
    assert f"waited {saved['queued_ms'] / 1000:.1f} s for the speed lab · TTFT {saved['ttft_ms']:.0f} ms" in line
    stored = store.message(reply.message_id)
    widget = MessageWidget(stored.id, "assistant", stored.content, stored.stats, stored.partial)
    qtbot.addWidget(widget)
    assert "waited" in widget.stats_label.text() and "for the speed lab" in widget.stats_label.text()
    # A wait too short to matter is not said.
    assert "waited" not in format_stats({**saved, "queued_ms": 20})
