"""The engine service, seen from the UI thread: jobs run off the UI thread and report through queued signals."""

import os
import sys
import threading

import pytest

from redline.ui.worker import EngineThread


class FakeEngine:
    def __init__(self):
        self.thread = threading.current_thread()
        self.flag = threading.Event()

    def cancel(self):
        self.flag.set()


def test_tasks_run_on_worker_thread_and_report(qtbot):
    worker = EngineThread(FakeEngine)
    seen = []
    worker.progress.connect(lambda tid, obj: seen.append((tid, obj, threading.current_thread())))

    def task(engine, report):
        report("halfway")
        return engine.thread is threading.current_thread() and engine.thread is not threading.main_thread()

    with qtbot.waitSignal(worker.done, timeout=5000) as blocker:
        tid = worker.submit(task)
    assert blocker.args == [tid, True]
    reported = [s for s in seen if s[1] == "halfway"]  # beside the scheduler's own events (Started)
    assert reported and reported[0][0] == tid and reported[0][2] is threading.main_thread()
    assert worker.shutdown()


def test_failure_reports_message(qtbot):
    worker = EngineThread(FakeEngine)

    def task(engine, report):
        raise ValueError("broken")

    with qtbot.waitSignal(worker.failed, timeout=5000) as blocker:
        worker.submit(task)
    assert "broken" in blocker.args[1]
    assert worker.shutdown()


def test_expected_errors_read_as_sentences_and_others_name_their_type(qtbot):
    """A RedlineError is written for the user (its message and fix); anything else is a bug report, named by
    its type, even if it happens to carry a ``hint`` attribute."""
    from redline.inference import ModelSourceError

    class Stray(Exception):
        hint = "not ours"

    worker = EngineThread(FakeEngine)
    messages = []
    for exc in (ModelSourceError("No model at /x.", "Pass a folder with config.json."), Stray("odd")):

        def task(engine, report, exc=exc):
            raise exc

        with qtbot.waitSignal(worker.failed, timeout=5000) as blocker:
            worker.submit(task)
        messages.append(blocker.args[1])
    assert messages == ["No model at /x. Pass a folder with config.json.", "Stray: odd"]
    assert worker.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a niceness per thread is Linux's")
def test_engine_thread_yields_to_the_ui(qtbot, monkeypatch):
    """The engine (and the torch threads it starts, which inherit it) runs nicer than the UI thread, so a
    decoding model cannot keep the window waiting for a core; the UI thread itself is left as it was."""
    from redline.ui.worker import ENGINE_NICE

    monkeypatch.delenv("REDLINE_ENGINE_NICE", raising=False)
    ui_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = EngineThread(FakeEngine)

    def task(engine, report):
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with qtbot.waitSignal(worker.done, timeout=5000) as blocker:
        worker.submit(task)
    assert blocker.args[1] == min(19, ui_nice + ENGINE_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ui_nice
    assert worker.shutdown()


def test_garbage_is_collected_on_the_ui_thread(qtbot, tiny_model_dir):
    """Collections the engine asks for (an unload) run on the UI thread, and the app's timer collector turns
    automatic collection (which runs on whichever thread allocates) off while it runs."""
    import gc
    import threading

    from redline.inference import garbage_collector, parse_precision
    from redline.ui.garbage import UiGarbageCollector
    from redline.ui.worker import EngineThread

    worker = EngineThread()
    threads = []
    real_collect = gc.collect

    def spy(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return real_collect(*args)

    gc.collect = spy
    try:
        assert garbage_collector() == worker._collect_on_ui_thread
        handle = worker.service.load(str(tiny_model_dir), parse_precision("fp32"))
        qtbot.waitUntil(lambda h=handle: h.done, timeout=120_000)
        handle = worker.service.unload()
        qtbot.waitUntil(lambda h=handle: h.done, timeout=120_000)
        assert threads and all(threads)  # every collection the engine asked for ran on the UI thread
    finally:
        gc.collect = real_collect
        worker.shutdown(10000)
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
