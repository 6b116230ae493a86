"""The handle a submitter holds for a request to the engine service: its events (in order, each once), its
cancel, its outcome. What a request is (``generation.request.GenerationRequest``), the events it reports
(``events.py``) and the errors it can be refused with (``errors.Busy``, ``errors.Refused``) are the engine's."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, Optional

from ..events import FINAL, Completed, Failed, FinishedEvent, GenerationResult

_ids = itertools.count(1)


class RequestHandle:
    """One submitted request: its events (in order, each once), its cancel, its outcome.

    Thread-safe. ``subscribe`` delivers events on the scheduler's thread as they happen (the Qt adapter
    forwards them to the UI thread); ``events()`` iterates them from any other thread, blocking."""

    def __init__(self, kind: str, request: Any = None):
        self.id = next(_ids)
        self.kind = kind  # "generate", "load", "unload", "job"
        self.request = request
        self._events: deque = deque()
        self._cond = threading.Condition()
        self._cancel = threading.Event()
        self._subscribers: list[Callable[[Any], None]] = []
        self._final: Any = None
        self._on_cancel: Optional[Callable[[], None]] = None

    # -- the submitter's side ------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop this request (and only this one): at once while it waits, else within one decode step."""
        self._cancel.set()
        with self._cond:
            self._cond.notify_all()
            hook = self._on_cancel
        if hook is not None and self._final is None:
            hook()

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """What the service does when this request is cancelled (a waiting request ends at once)."""
        with self._cond:
            self._on_cancel = hook

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._final is not None

    def subscribe(self, callback: Callable[[Any], None]) -> None:
        """``callback(event)`` for every event from now on (earlier ones first, in order)."""
        with self._cond:
            backlog = list(self._events)
            self._subscribers.append(callback)
        for event in backlog:
            callback(event)

    def history(self) -> list:
        """The events so far, without waiting."""
        with self._cond:
            return list(self._events)

    def events(self, timeout: Optional[float] = None) -> Iterator[Any]:
        """Every event until the final one (FinishedEvent, Completed or Failed), waiting for each."""
        index = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while index >= len(self._events):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
                    self._cond.wait(left)
                event = self._events[index]
            index += 1
            yield event
            if isinstance(event, FINAL):
                return

    def wait(self, timeout: Optional[float] = None) -> Any:
        """The final event, once it has come."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._final is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
                self._cond.wait(left)
            return self._final

    def result(self, timeout: Optional[float] = None) -> Any:
        """The GenerationResult (or a job's value); raises what made the request fail."""
        final = self.wait(timeout)
        if isinstance(final, Failed):
            raise final.error
        return final.result if isinstance(final, FinishedEvent) else final.value

    # -- the scheduler's side ------------------------------------------------------------------------
    def emit(self, event: Any) -> None:
        with self._cond:
            if self._final is not None:
                return  # nothing after the end
            self._events.append(event)
            if isinstance(event, FINAL):
                self._final = event
            subscribers = list(self._subscribers)
            self._cond.notify_all()
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # a subscriber's fault must not stop the scheduler or other requests
                pass

    def finish(self, result: GenerationResult) -> None:
        self.emit(FinishedEvent(result))

    def fail(self, error: BaseException) -> None:
        self.emit(Failed(error))

    def complete(self, value: Any = None) -> None:
        self.emit(Completed(value))
