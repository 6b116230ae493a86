"""What is submitted to the engine service, what it reports back, and the handle a submitter holds."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from redline.inference.decoding.options import DecodeOptions, SamplingSettings
from redline.inference.errors import RedlineError
from redline.inference.events import FinishedEvent, GenerationResult, PrefillProgress  # noqa: F401 - re-exported


@dataclass
class GenerationRequest:
    """A generation: chat ``messages`` (rendered with the model's chat template) or prompt ``input_ids``."""

    messages: Optional[Sequence[dict]] = None
    input_ids: Optional[Sequence[int]] = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    options: DecodeOptions = field(default_factory=DecodeOptions)
    context: Optional[int] = None  # cap on the context (the model's own limit otherwise)
    # An extra logits processor for this request alone (transformers' interface: (input_ids, scores) →
    # scores), e.g. a grammar that constrains the output to a JSON schema.
    logits_processor: Any = None
    client: str = ""  # who asked: "chat", "lab", "api", "cli" (shown in status and queue notes)

    def __post_init__(self):
        if (self.messages is None) == (self.input_ids is None):
            raise RedlineError("A generation request needs either messages or input ids, not both.")


# -- events beside the generation's own (TokenEvent, StatsEvent, FinishedEvent in inference/events.py) ----
@dataclass
class Queued:
    """The request waits: ``ahead`` requests before it, and why (e.g. "waiting for the speed lab")."""

    ahead: int
    reason: str = ""


@dataclass
class Started:
    """The scheduler took the request up."""

    time_s: float = field(default_factory=time.monotonic)
    batched: bool = False  # decoded together with other requests (continuous batching)
    note: str = ""


@dataclass
class Progress:
    """Progress of a load or another job: a fraction and what happens now."""

    fraction: float
    phase: str


@dataclass
class Completed:
    """A load, unload or other job ended; ``value`` is what it returned."""

    value: Any = None


@dataclass
class Failed:
    """The request could not run or failed: ``error`` says why in a sentence a user can act on."""

    error: BaseException

    @property
    def message(self) -> str:
        return str(self.error) if isinstance(self.error, RedlineError) else f"{type(self.error).__name__}: {self.error}"


FINAL = (FinishedEvent, Completed, Failed)
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

    # -- the submitter's side ------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop this request (and only this one): before it starts, or within one decode step."""
        self._cancel.set()
        with self._cond:
            self._cond.notify_all()

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


class Busy(RedlineError):
    """The engine's queue is full: try again shortly (an HTTP server answers 429)."""


class Refused(RedlineError):
    """The request can never run as asked (it cannot fit, or asks for something the model cannot do)."""
