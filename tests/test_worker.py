"""The engine worker runs tasks off the UI thread and reports through queued signals."""
import threading

from ui.worker import EngineThread


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
    assert seen and seen[0][1] == "halfway" and seen[0][2] is threading.main_thread()
    assert worker.shutdown()


def test_failure_reports_message(qtbot):
    worker = EngineThread(FakeEngine)

    def task(engine, report):
        raise ValueError("broken")

    with qtbot.waitSignal(worker.failed, timeout=5000) as blocker:
        worker.submit(task)
    assert "broken" in blocker.args[1]
    assert worker.shutdown()
