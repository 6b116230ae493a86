"""The engine service, seen from the UI thread: the only way the window talks to the engine.

``EngineThread`` owns one ``redline.inference.EngineService``, whose scheduler thread owns the model (torch and
transformers import there, never on the UI thread). The window submits generations (``submit_generation``)
and jobs (``submit``: ``fn(engine, report)`` run with the engine to itself, e.g. a load or a speed-lab run);
each gets an id, its own events and its own cancel (``cancel(id)``: it stops that request and no other).

Events reach the UI thread without flooding its event queue: on the scheduler thread they are appended to the
request's buffer and at most one wake-up signal is pending per request; the UI thread drains the buffer and
emits ``events(id, list)`` (and ``progress(id, obj)`` for each), then ``done(id, value)`` or
``failed(id, message, exception)`` at the end. The UI never waits on the engine.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, Signal, Slot

from redline.inference import (
    Completed,
    EngineService,
    Failed,
    FinishedEvent,
    RedlineError,
    Started,
    garbage_collector,
    set_garbage_collector,
)

Task = Callable[[Any, Callable[[object], None]], object]

# The engine thread's niceness on Linux (REDLINE_ENGINE_NICE overrides; 0 turns it off). Decoding keeps every
# core busy, and the UI thread then waits for a core: over 100 starter replies through the window on a 2-core
# machine, a 5 ms timer's longest gap was 41-52 ms at nice 0 and 26-27 ms at nice 5, with the same tokens/s.
ENGINE_NICE = 5
# How long the engine waits for the UI thread to collect garbage for it (an unload); past that it goes on and
# the memory comes back at the next collection.
COLLECT_WAIT_S = 5.0


def yield_to_the_ui() -> None:
    """Lower the calling (engine) thread's priority, before torch creates its worker threads, which inherit it.
    Linux takes a niceness per thread; elsewhere the threads run at the app's priority."""
    if not sys.platform.startswith("linux"):
        return
    try:
        nice = int(os.environ.get("REDLINE_ENGINE_NICE", ENGINE_NICE))
        if nice > 0:  # relative to the app's own niceness (a user may have started it niced)
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (ValueError, OSError):  # a bad value, or a system that refuses: run at normal priority
        pass


def user_message(exc: BaseException) -> str:
    """A RedlineError is written for the user (what happened, what to change); anything else is a bug,
    named by its type."""
    return str(exc) if isinstance(exc, RedlineError) else f"{type(exc).__name__}: {exc}"


class EngineThread(QObject):
    """Owns the engine service. Signals are delivered on the UI thread."""

    events = Signal(int, object)  # request id, list of events (in order)
    progress = Signal(int, object)  # request id, one event or one object a job reported
    done = Signal(int, object)  # request id, a job's value or a generation's GenerationResult
    failed = Signal(int, str, object)  # request id, message for the user, exception
    started = Signal(int)  # request id (the scheduler took it up)
    _wake = Signal(int)
    _collect = Signal(object)  # a threading.Event to set once the UI thread has collected

    def __init__(
        self,
        engine_factory: Callable[[], Any] | None = None,
        parent: QObject | None = None,
        max_active: int | None = None,
        max_queued: int | None = None,
    ):
        super().__init__(parent)
        kwargs = {"max_active": max_active} if max_active else {}
        if max_queued:
            kwargs["max_queued"] = max_queued
        self.service = EngineService(engine_factory, on_thread_start=yield_to_the_ui, **kwargs)
        self._lock = threading.Lock()
        self._buffers: dict[int, list] = {}
        self._handles: dict[int, Any] = {}
        # Always queued, also when an event is pushed from this thread (a request's first events are replayed
        # while it is submitted): the submitter learns its request's id before any event reaches it.
        self._wake.connect(self._drain, Qt.QueuedConnection)
        # When the engine frees a model, the cyclic garbage it collects can hold Qt objects (the window's and
        # the speed lab's charts), which must be destroyed on the UI thread: a Qt object destroyed on the
        # engine's thread while the UI thread is inside Qt deadlocked both (seen in a speed-lab run).
        self._closing = False
        self._collect.connect(self._collect_now, Qt.QueuedConnection)
        set_garbage_collector(self._collect_on_ui_thread)

    @property
    def engine(self):
        """The engine object, for reading what is loaded (never for calling it); None until it exists."""
        return self.service.engine

    def submit(self, fn: Task, label: str = "", interrupt: bool = False) -> int:
        """Run ``fn(engine, report)`` on the engine's thread, in order with everything else."""
        return self._follow(self.service.call(fn, label, interrupt))

    def submit_generation(self, request) -> int:
        """Queue a generation (raises Busy or Refused at once when it cannot be taken)."""
        return self._follow(self.service.submit(request))

    def cancel(self, request_id: int) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    def busy(self) -> bool:
        return bool(self._handles)

    def status(self) -> dict:
        return self.service.status()

    def stopped(self) -> bool:
        """True once the scheduler thread has ended."""
        return self.service.stopped()

    def shutdown(self, timeout_ms: int = 2000) -> bool:
        """Cancel everything and stop the scheduler; True if it stopped within the timeout."""
        self._closing = True  # the UI thread now waits here, outside Qt: the engine may collect on its own
        try:
            return self.service.shutdown(timeout_ms / 1000)
        finally:
            if garbage_collector() == self._collect_on_ui_thread:
                set_garbage_collector(None)

    # -- garbage collection on the UI thread --------------------------------------------------------------
    def _collect_on_ui_thread(self) -> None:  # any thread
        if self._closing or threading.current_thread() is threading.main_thread():
            gc.collect()
            return
        done = threading.Event()
        self._collect.emit(done)
        done.wait(COLLECT_WAIT_S)  # the UI thread busy for that long: go on; the next collection frees it

    @Slot(object)
    def _collect_now(self, done) -> None:  # the UI thread
        try:
            gc.collect()
        finally:
            done.set()

    # -- from the scheduler's thread to this one --------------------------------------------------------
    def _follow(self, handle) -> int:
        self._handles[handle.id] = handle
        handle.subscribe(lambda event, hid=handle.id: self._push(hid, event))
        return handle.id

    def _push(self, request_id: int, event) -> None:  # the scheduler's thread
        with self._lock:
            buffer = self._buffers.get(request_id)
            if buffer is not None:
                buffer.append(event)
                return
            self._buffers[request_id] = [event]
        self._wake.emit(request_id)

    @Slot(int)
    def _drain(self, request_id: int) -> None:  # the UI thread
        with self._lock:
            events = self._buffers.pop(request_id, [])
        if not events:
            return
        final = events[-1] if isinstance(events[-1], (FinishedEvent, Completed, Failed)) else None
        body = events[:-1] if final is not None else events
        for ev in body:
            if isinstance(ev, Started):
                self.started.emit(request_id)
        if body:
            self.events.emit(request_id, body)
            for ev in body:
                self.progress.emit(request_id, ev)
        if final is None:
            return
        self._handles.pop(request_id, None)
        if isinstance(final, Failed):
            self.failed.emit(request_id, user_message(final.error), final.error)
        elif isinstance(final, FinishedEvent):
            self.done.emit(request_id, final.result)
        else:
            self.done.emit(request_id, final.value)
