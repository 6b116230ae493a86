"""The engine's worker thread and the only way the UI talks to it.

One long-lived ``Engine`` lives on one QThread. The UI submits *tasks* —
plain functions ``fn(engine, report)`` — through a queued signal; they run one
after another on the worker thread. ``report(obj)`` sends progress (token
events, load progress, bench rows) back to the UI thread as a queued signal.
A task's return value arrives as ``done(task_id, value)``; an exception as
``failed(task_id, message, exception)``. The UI never waits on the engine:
cancellation is ``engine.cancel()``, a thread-safe flag the decode loop and the
loader check.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import traceback
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal, Slot

from redline.inference import RedlineError

Task = Callable[[Any, Callable[[object], None]], object]

# The engine thread's niceness on Linux (REDLINE_ENGINE_NICE overrides; 0 turns it off). Decoding keeps every
# core busy, and the UI thread then waits for a core: over 100 starter replies through the window on a 2-core
# machine, a 5 ms timer's longest gap was 41-52 ms at nice 0 and 26-27 ms at nice 5, with the same tokens/s.
ENGINE_NICE = 5


def yield_to_the_ui() -> None:
    """Lower the calling (engine) thread's priority, before torch creates its worker threads, which inherit it.
    Linux takes a niceness per thread; elsewhere the QThread's LowPriority (see EngineThread) does this."""
    if not sys.platform.startswith("linux"):
        return
    try:
        nice = int(os.environ.get("REDLINE_ENGINE_NICE", ENGINE_NICE))
        if nice > 0:  # relative to the app's own niceness (a user may have started it niced)
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (ValueError, OSError):  # a bad value, or a system that refuses: run at normal priority
        pass


class _Runner(QObject):
    progress = Signal(int, object)
    done = Signal(int, object)
    failed = Signal(int, str, object)
    started = Signal(int)

    def __init__(self, engine_factory: Callable[[], Any]):
        super().__init__()
        self._engine_factory = engine_factory
        self.engine = None

    @Slot(int, object)
    def run(self, task_id: int, fn: Task) -> None:
        if self.engine is None:
            # Created on the worker thread: torch and transformers import here, not on the UI thread.
            yield_to_the_ui()
            try:
                self.engine = self._engine_factory()
            except Exception as exc:  # pragma: no cover - only if torch itself is broken
                self.failed.emit(task_id, f"The engine could not start: {exc}", exc)
                return
        self.started.emit(task_id)
        try:
            value = fn(self.engine, lambda obj: self.progress.emit(task_id, obj))
        except Exception as exc:
            message = str(exc) if isinstance(exc, RedlineError) else f"{type(exc).__name__}: {exc}"
            exc.__redline_traceback__ = traceback.format_exc()
            self.failed.emit(task_id, message, exc)
            return
        self.done.emit(task_id, value)


class EngineThread(QObject):
    """Owns the worker thread. Signals are delivered on the UI thread."""

    progress = Signal(int, object)  # task id, reported object
    done = Signal(int, object)  # task id, return value
    failed = Signal(int, str, object)  # task id, message for the user, exception
    started = Signal(int)  # task id (the worker picked it up)
    _submit = Signal(int, object)

    def __init__(self, engine_factory: Callable[[], Any] | None = None, parent: QObject | None = None):
        super().__init__(parent)
        if engine_factory is None:

            def engine_factory():
                from redline.inference import Engine

                return Engine()

        self._ids = itertools.count(1)
        self._thread = QThread()
        self._thread.setObjectName("redline-engine")
        self._runner = _Runner(engine_factory)
        self._runner.moveToThread(self._thread)
        self._submit.connect(self._runner.run)  # queued: the runner lives on another thread
        self._runner.progress.connect(self.progress)
        self._runner.done.connect(self.done)
        self._runner.failed.connect(self.failed)
        self._runner.started.connect(self.started)
        self._pending: set[int] = set()
        self.done.connect(lambda tid, _v: self._pending.discard(tid))
        self.failed.connect(lambda tid, _m, _e: self._pending.discard(tid))
        self._thread.start(QThread.LowPriority)  # Windows and macOS honour it; Linux: yield_to_the_ui

    @property
    def engine(self):
        """The engine object, for thread-safe calls only (``cancel()``); None until the first task runs."""
        return self._runner.engine

    def submit(self, fn: Task) -> int:
        task_id = next(self._ids)
        self._pending.add(task_id)
        self._submit.emit(task_id, fn)
        return task_id

    def busy(self) -> bool:
        return bool(self._pending)

    def cancel(self) -> None:
        engine = self._runner.engine
        if engine is not None:
            engine.cancel()

    def shutdown(self, timeout_ms: int = 2000) -> bool:
        """Cancel what runs, stop the thread; True if it stopped within the timeout."""
        self.cancel()
        self._thread.quit()
        return self._thread.wait(timeout_ms)
