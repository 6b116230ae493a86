"""The window's one way to the engine: ``EngineBridge`` owns the ``redline.inference.EngineService`` (whose scheduler
thread owns the model; torch and transformers import there, never on the UI thread) and hands back one
``Channel`` per request.

A channel is the request's events, in order, delivered on the UI thread in batches (``Channel.events``), the last
batch ending in the final event (``FinishedEvent`` for a generation, ``Completed`` or ``Failed`` for a job); its
``cancel()`` stops that request and no other; ``await channel`` gives the result (a ``GenerationResult`` or a job's
value) or raises ``TaskFailed`` with a sentence for the user. A request the service refuses at once (``Busy``,
``Refused``, the engine shutting down) gets a channel that ends in ``Failed`` on the next turn of the event loop,
so every caller handles one shape of outcome.

Events reach the UI thread without flooding its event queue: on the scheduler thread they are appended to the
request's buffer and at most one wake-up signal is pending per request. The UI thread never waits on the engine
(``shutdown`` does, once, when the window closes; ``flush`` then hands over what arrived meanwhile).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject, Qt, Signal, Slot

from ..inference import (
    Completed,
    EngineService,
    Failed,
    FinishedEvent,
    RedlineError,
    garbage_collector,
    set_garbage_collector,
)
from .signals import emit

Job = Callable[[Any, Callable[[object], None]], object]
FINAL_EVENTS = (FinishedEvent, Completed, Failed)  # how a request ends: a generation's result, a job's value, a failure

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


class TaskFailed(Exception):
    """The request failed; ``str()`` is the message for the user, ``original`` the exception."""

    def __init__(self, message: str, original: Optional[BaseException] = None):
        super().__init__(message)
        self.original = original


class Channel(QObject):
    """One request: its events in order, ending in the final event; its cancel; its outcome."""

    events = Signal(object)  # a list: a batch of events, in order; the last batch ends with the final event

    def __init__(self, bridge: "EngineBridge", request_id: int, kind: str, handle: Any = None):
        super().__init__()
        self._bridge = bridge
        self.id = request_id
        self.kind = kind  # "generate", "load", "unload", "job"
        self.handle = handle  # the service's RequestHandle (None for a request refused at once)
        self.final: Any = None  # the final event, once it has been delivered here
        self.cancel_requested = False
        self._waiters: list[asyncio.Future] = []

    @property
    def done(self) -> bool:
        return self.final is not None

    def cancel(self) -> None:
        """Stop this request (and only this one): at once while it waits, else within one step."""
        self.cancel_requested = True
        if self.handle is not None and self.final is None:
            self.handle.cancel()

    def result(self) -> Any:
        """The GenerationResult or the job's value; raises TaskFailed. Only once ``done``."""
        final = self.final
        if isinstance(final, Failed):
            raise TaskFailed(user_message(final.error), final.error)
        if isinstance(final, FinishedEvent):
            return final.result
        if isinstance(final, Completed):
            return final.value
        raise RuntimeError(f"request {self.id} has not ended")

    def __await__(self):
        if self.final is not None:
            return self.result()
        future = asyncio.get_event_loop().create_future()
        self._waiters.append(future)
        yield from future.__await__()
        return self.result()

    def _deliver(self, events: list) -> None:  # the UI thread
        if self.final is not None:
            return
        if isinstance(events[-1], FINAL_EVENTS):
            self.final = events[-1]
        emit(self.events, events)
        if self.final is not None:
            for future in self._waiters:
                if not future.done():
                    future.set_result(None)
            self._waiters.clear()

    def final_from_engine(self) -> Any:
        """The final event if the engine has sent it, delivered here or not yet (after ``shutdown``)."""
        if self.final is not None:
            return self.final
        if self.handle is not None and self.handle.done:
            return self.handle.wait(0)
        return None


class EngineBridge(QObject):
    """Owns the engine service; every request to it gets a ``Channel``, delivered on the UI thread."""

    _wake = Signal(int)
    _collect = Signal(object)  # a threading.Event to set once the UI thread has collected

    def __init__(
        self,
        engine_factory: Optional[Callable[[], Any]] = None,
        parent: Optional[QObject] = None,
        max_active: Optional[int] = None,
        max_queued: Optional[int] = None,
    ):
        super().__init__(parent)
        kwargs = {"max_active": max_active} if max_active else {}
        if max_queued:
            kwargs["max_queued"] = max_queued
        self.service = EngineService(engine_factory, on_thread_start=yield_to_the_ui, **kwargs)
        self._lock = threading.Lock()
        self._buffers: dict[int, list] = {}
        self._channels: dict[int, Channel] = {}
        self._refused = 0  # ids for requests refused at once: negative, never a handle's
        # Always queued, also when an event is pushed from this thread (a request's first events are replayed
        # while it is submitted): the submitter holds its channel before any event reaches it.
        self._wake.connect(self._drain, Qt.QueuedConnection)
        # When the engine frees a model, the cyclic garbage it collects can hold Qt objects (the window's and
        # the speed lab's charts), which must be destroyed on the UI thread: a Qt object destroyed on the
        # engine's thread while the UI thread is inside Qt deadlocked both (seen in a speed-lab run).
        self._closing = False
        self._collect.connect(self._collect_now, Qt.QueuedConnection)
        set_garbage_collector(self.collect_on_ui_thread)

    @property
    def engine(self):
        """The engine object, for reading what is loaded (never for calling it); None until it exists."""
        return self.service.engine

    # -- requests ----------------------------------------------------------------------------------------
    def generate(self, request) -> Channel:
        """A generation: TokenEvents, StatsEvents and the rest, ending in FinishedEvent(GenerationResult)."""
        return self._open("generate", lambda: self.service.submit(request))

    def run(self, fn: Job, label: str = "", interrupt: bool = False) -> Channel:
        """Run ``fn(engine, report)`` on the engine's thread with the engine to itself, in order with the rest;
        what it reports are its events; it ends in Completed(value) or Failed(error)."""
        return self._open("job", lambda: self.service.call(fn, label, interrupt))

    def load(
        self,
        model: str,
        precision: Any = "auto",
        draft: Optional[str] = None,
        draft_precision: Any = "auto",
        opt_in: Optional[Callable[[Any], bool]] = None,
        api_key: Optional[str] = None,
        context: Optional[int] = None,
    ) -> Channel:
        """The engine's one load (``EngineService.load``): Progress events, ending in the ``LoadReport``. It
        interrupts: replies being written stop with "Stopped so that the model to load could start."
        ``context``: the chat's (Settings → context), which a load that runs out of memory names."""
        return self._open(
            "load",
            lambda: self.service.load(
                model, precision, draft, draft_precision, opt_in, interrupt=True, api_key=api_key, context=context
            ),
        )

    def unload(self) -> Channel:
        return self._open("unload", lambda: self.service.unload(interrupt=True))

    def cancel(self, request_id: int) -> None:
        channel = self._channels.get(request_id)
        if channel is not None:
            channel.cancel()

    def busy(self) -> bool:
        return bool(self._channels)

    def status(self) -> dict:
        return self.service.status()

    def stopped(self) -> bool:
        """True once the scheduler thread has ended."""
        return self.service.stopped()

    def shutdown(self, timeout_ms: int = 2000) -> bool:
        """Cancel everything and stop the scheduler; True if it stopped within the timeout. What the requests
        sent meanwhile waits in their buffers: ``flush`` delivers it."""
        self._closing = True  # the UI thread now waits here, outside Qt: the engine may collect on its own
        try:
            return self.service.shutdown(timeout_ms / 1000)
        finally:
            if garbage_collector() == self.collect_on_ui_thread:
                set_garbage_collector(None)

    def flush(self) -> None:
        """Deliver every buffered event now (the UI thread, e.g. after ``shutdown``), without waiting."""
        with self._lock:
            pending = list(self._buffers)
        for request_id in pending:
            self._drain(request_id)

    # -- garbage collection on the UI thread --------------------------------------------------------------
    def collect_on_ui_thread(self) -> None:  # any thread
        if self._closing or threading.current_thread() is threading.main_thread():
            gc.collect()
            return
        done = threading.Event()
        emit(self._collect, done)
        done.wait(COLLECT_WAIT_S)  # the UI thread busy for that long: go on; the next collection frees it

    @Slot(object)
    def _collect_now(self, done) -> None:  # the UI thread
        try:
            gc.collect()
        finally:
            done.set()

    # -- from the scheduler's thread to this one --------------------------------------------------------
    def _open(self, kind: str, submit: Callable[[], Any]) -> Channel:
        try:
            handle = submit()
        except Exception as exc:  # Busy, Refused, or the engine shutting down: said at once, as the channel's end
            self._refused -= 1
            channel = Channel(self, self._refused, kind)
            self._channels[channel.id] = channel
            self._push(channel.id, Failed(exc))
            return channel
        channel = Channel(self, handle.id, kind, handle)
        self._channels[handle.id] = channel
        handle.subscribe(lambda event, hid=handle.id: self._push(hid, event))
        return channel

    def _push(self, request_id: int, event) -> None:  # the scheduler's thread (or this one, at once)
        with self._lock:
            buffer = self._buffers.get(request_id)
            if buffer is not None:
                buffer.append(event)
                return
            self._buffers[request_id] = [event]
        emit(self._wake, request_id)

    @Slot(int)
    def _drain(self, request_id: int) -> None:  # the UI thread
        with self._lock:
            events = self._buffers.pop(request_id, [])
        if not events:
            return
        channel = self._channels.get(request_id)
        if channel is None:
            return
        if isinstance(events[-1], FINAL_EVENTS):
            self._channels.pop(request_id, None)
        channel._deliver(events)
