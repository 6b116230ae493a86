"""The bridge to the engine service, seen from the UI thread: each request gets one channel, its events delivered on
the UI thread in order and ending in its outcome; jobs run off the UI thread."""

import os
import sys
import threading

import pytest
from gui_helpers import aloop  # noqa: F401 - fixture

from redline.ui.bridge import EngineBridge, TaskFailed


class FakeEngine:
    def __init__(self):
        self.thread = threading.current_thread()
        self.flag = threading.Event()

    def cancel(self):
        self.flag.set()


def test_tasks_run_on_worker_thread_and_report(qtbot):
    from redline.inference import Completed

    bridge = EngineBridge(FakeEngine)
    seen = []

    def task(engine, report):
        report("halfway")
        return engine.thread is threading.current_thread() and engine.thread is not threading.main_thread()

    channel = bridge.run(task)
    channel.events.connect(lambda events: seen.extend((ev, threading.current_thread()) for ev in events))
    qtbot.waitUntil(lambda: channel.done, timeout=5000)
    assert channel.result() is True
    reported = [s for s in seen if s[0] == "halfway"]  # beside the scheduler's own events (Started)
    assert reported and reported[0][1] is threading.main_thread()
    assert isinstance(seen[-1][0], Completed) and seen[-1][0].value is True  # one channel, ending in the outcome
    assert bridge.shutdown()


def test_a_channel_is_awaitable_and_a_refused_request_ends_in_its_failure(qtbot, aloop):
    """``await channel`` gives the value; a request the service refuses at once still gets a channel, whose end
    (a failure with the service's sentence) arrives like any other request's."""
    import asyncio

    from redline.inference import Failed

    bridge = EngineBridge(FakeEngine, max_queued=1)
    hold = threading.Event()
    try:
        got = []

        async def ask():
            got.append(await bridge.run(lambda engine, report: 42))

        asyncio.ensure_future(ask())
        qtbot.waitUntil(lambda: got == [42], timeout=5000)
        bridge.run(lambda engine, report: hold.wait(10))  # holds the engine
        qtbot.waitUntil(lambda: bridge.status()["running"] is not None, timeout=5000)
        bridge.run(lambda engine, report: None)  # the queue is full now
        refused = bridge.run(lambda engine, report: None)
        ends = []
        refused.events.connect(ends.extend)
        qtbot.waitUntil(lambda: refused.done, timeout=5000)
        assert isinstance(ends[-1], Failed) and "busy" in str(ends[-1].error)
        with pytest.raises(TaskFailed, match="busy"):
            refused.result()
    finally:
        hold.set()
        assert bridge.shutdown()


def test_failure_reports_message(qtbot):
    bridge = EngineBridge(FakeEngine)

    def task(engine, report):
        raise ValueError("broken")

    channel = bridge.run(task)
    qtbot.waitUntil(lambda: channel.done, timeout=5000)
    with pytest.raises(TaskFailed, match="broken"):
        channel.result()
    assert bridge.shutdown()


def test_expected_errors_read_as_sentences_and_others_name_their_type(qtbot):
    """A RedlineError is written for the user (its message and fix); anything else is a bug report, named by
    its type, even if it happens to carry a ``hint`` attribute."""
    from redline.inference import ModelSourceError

    class Stray(Exception):
        hint = "not ours"

    bridge = EngineBridge(FakeEngine)
    messages = []
    for exc in (ModelSourceError("No model at /x.", "Pass a folder with config.json."), Stray("odd")):

        def task(engine, report, exc=exc):
            raise exc

        channel = bridge.run(task)
        qtbot.waitUntil(lambda c=channel: c.done, timeout=5000)
        try:
            channel.result()
        except TaskFailed as failed:
            messages.append(str(failed))
    assert messages == ["No model at /x. Pass a folder with config.json.", "Stray: odd"]
    assert bridge.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a niceness per thread is Linux's")
def test_engine_thread_yields_to_the_ui(qtbot, monkeypatch):
    """The engine (and the torch threads it starts, which inherit it) runs nicer than the UI thread, so a
    decoding model cannot keep the window waiting for a core; the UI thread itself is left as it was."""
    from redline.ui.bridge import ENGINE_NICE

    monkeypatch.delenv("REDLINE_ENGINE_NICE", raising=False)
    ui_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    bridge = EngineBridge(FakeEngine)

    def task(engine, report):
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    channel = bridge.run(task)
    qtbot.waitUntil(lambda: channel.done, timeout=5000)
    assert channel.result() == min(19, ui_nice + ENGINE_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ui_nice
    assert bridge.shutdown()


def test_garbage_is_collected_on_the_ui_thread(qtbot, tiny_model_dir):
    """Collections the engine asks for (an unload) run on the UI thread, and the app's timer collector turns
    automatic collection (which runs on whichever thread allocates) off while it runs."""
    import gc
    import threading

    from redline.inference import garbage_collector, parse_precision
    from redline.ui.garbage import UiGarbageCollector

    bridge = EngineBridge()
    threads = []
    real_collect = gc.collect

    def spy(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return real_collect(*args)

    gc.collect = spy
    try:
        assert garbage_collector() == bridge.collect_on_ui_thread
        loaded = bridge.load(str(tiny_model_dir), parse_precision("fp32"))
        qtbot.waitUntil(lambda: loaded.done, timeout=120_000)
        assert loaded.result().name == "tiny-llama"  # the engine's LoadReport
        unloaded = bridge.unload()
        qtbot.waitUntil(lambda: unloaded.done, timeout=120_000)
        assert threads and all(threads)  # every collection the engine asked for ran on the UI thread
    finally:
        gc.collect = real_collect
        bridge.shutdown(10000)
    assert garbage_collector() is None
    collector = UiGarbageCollector(interval_ms=10)
    try:
        assert not gc.isenabled()
        for _ in range(3 * collector.thresholds[0]):  # cycles, more than the youngest generation's threshold
            junk = []
            junk.append(junk)
        del junk
        assert gc.get_count()[0] > collector.thresholds[0]  # nothing collected them automatically
        qtbot.waitUntil(lambda: gc.get_count()[0] <= collector.thresholds[0], timeout=5000)
    finally:
        collector.stop()
    assert gc.isenabled()
