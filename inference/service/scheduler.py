"""The engine service: one scheduler thread owns the Engine (the model); everything else submits requests.

Order: requests run in the order they arrive. Generations on the fast path (``generation/batch.Batcher``) run
together — while one streams, the next joins at the following step, up to ``max_active`` at once — so no
request waits for another to end. Everything else needs the engine alone and runs one at a time: loads,
unloads, draft changes, other jobs (the speed lab, the wizard's checks) and generations on strategies that
cannot batch (speculative, prompt lookup, the transformers strategies, models the fast path does not
support). Such a request at the front of the queue lets the running batch finish, then runs; the requests
behind it are told what they wait for (``Queued``).

A load asked with ``interrupt=True`` (the window's model switch) stops the running generations at their next
step instead of waiting for them; each ends as "cancelled" with a note saying why.

Whether a request can run now, and how, is the admission object's call (``admission.py``): at most
``max_queued`` requests wait (one more is refused at once with ``Busy``); one that can never fit (more new tokens
than the model's context or the KV budget allows) is refused with ``Refused``. The scheduler's step is then "an
exclusive job, or one step of the replies running together on the target" (``Backend.step``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..backends.local import BatchLimits
from ..engine import Engine, LoadRequest
from ..errors import Busy, Cancelled, RedlineError, Refused
from ..events import GenerationResult, Queued, Started
from ..generation.request import GenerationRequest
from .admission import MAX_ACTIVE, MAX_QUEUED, Admission
from .requests import RequestHandle

CLIENT_LABELS = {"chat": "a chat reply", "api": "an API request", "cli": "a reply", "lab": "the speed lab"}


@dataclass
class _Job:
    handle: RequestHandle
    submitted: float
    request: Optional[GenerationRequest] = None  # a generation
    prepared: Any = None  # its prompt and limits, once worked out (generation.request.Prepared)
    fn: Optional[Callable[[Any, Callable[[Any], None]], Any]] = None  # anything else: fn(engine, report)
    label: str = ""  # what others wait for while it runs ("the speed lab", "the model to load")
    interrupt: bool = False


class EngineService:
    def __init__(
        self,
        engine_factory: Optional[Callable[[], Any]] = None,
        max_active: int = MAX_ACTIVE,
        max_queued: int = MAX_QUEUED,
        on_thread_start: Optional[Callable[[], None]] = None,
        start: bool = True,
        kv_budget_tokens: Optional[int] = None,
    ):
        self._engine_factory = engine_factory
        self.admission = Admission(max_active, max_queued, kv_budget_tokens=kv_budget_tokens)
        self._on_thread_start = on_thread_start
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running: Optional[_Job] = None  # the exclusive job now running
        self._together = None  # the target whose replies run together now (Backend.add/step), while it has any
        self.engine = None  # created on the scheduler thread (torch imports there)
        self.engine_error: Optional[BaseException] = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="redline-engine", daemon=True)
        if start:
            self._thread.start()

    # -- submitting ---------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a generation; its handle streams TokenEvents, StatsEvents and a FinishedEvent."""
        self.admission.check_request(request, self.target)
        label = CLIENT_LABELS.get(request.client, "another request")  # what others wait for, if it runs alone
        job = _Job(RequestHandle("generate", request), time.perf_counter(), request=request, label=label)
        return self._enqueue(job)

    def call(
        self,
        fn: Callable[[Any, Callable[[Any], None]], Any],
        label: str = "",
        interrupt: bool = False,
        kind: str = "job",
    ) -> RequestHandle:
        """Run ``fn(engine, report)`` on the engine's thread with the engine to itself; ``report(obj)`` sends
        ``obj`` as an event. Its handle ends with Completed(value) or Failed(error)."""
        return self._enqueue(_Job(RequestHandle(kind), time.perf_counter(), fn=fn, label=label, interrupt=interrupt))

    def load(
        self,
        model: str,
        precision: Any = "auto",
        draft: Optional[str] = None,
        draft_precision: Any = "auto",
        opt_in=None,
        interrupt: bool = True,
        api_key: Optional[str] = None,
        draft_required: bool = False,
        context: Optional[int] = None,
    ) -> RequestHandle:
        """Load ``model`` (and a draft), with Progress events; the handle's value is the ``engine.LoadReport``.
        The one load job of the window, the wizard, the CLI and the server (``Engine.load_all``). ``context``: the
        chat's, which a load that runs out of memory names."""

        request = LoadRequest(model, precision, draft, draft_precision, api_key, opt_in, draft_required, context)

        def job(engine, report):
            return engine.load_all(request, report, should_cancel=report.cancelled)

        return self.call(job, "the model to load", interrupt, "load")

    def unload(self, interrupt: bool = True) -> RequestHandle:
        return self.call(lambda engine, report: engine.unload(), "the model to unload", interrupt, "unload")

    def _enqueue(self, job: _Job) -> RequestHandle:
        with self._cond:
            if self._stopping:
                raise RedlineError("The engine is shutting down.", "Start Redline again.")
            self.admission.check_queue(len(self._queue))
            ahead_jobs = list(self._queue)
            self._queue.append(job)
            running = self._running
            self._cond.notify_all()
        job.handle.on_cancel(lambda: self._cancel_queued(job))
        if ahead_jobs or running is not None:
            job.handle.emit(Queued(len(ahead_jobs) + (1 if running else 0), self._wait_reason(ahead_jobs)))
        elif self._batch_busy() and self._how(job) == "exclusive":  # it needs the engine alone: they end first
            replies = self._together.running()
            job.handle.emit(
                Queued(replies, f"waiting for {replies} {'reply' if replies == 1 else 'replies'} being written to end")
            )
        return job.handle

    @property
    def target(self):
        """The engine's target (a backend), or None before the engine exists or with no model loaded (an engine made
        by a factory for jobs alone may have no target at all)."""
        return getattr(self.engine, "target", None)

    @property
    def max_active(self) -> int:
        return self.admission.max_active

    @property
    def max_queued(self) -> int:
        return self.admission.max_queued

    def _cancel_queued(self, job: _Job) -> None:
        """A request cancelled while it waits ends now, whatever runs (a speed-lab run holds the engine's thread)."""
        with self._cond:
            if job not in self._queue:
                return  # running (it stops at its next step) or over
            self._queue.remove(job)
            waiting = list(self._queue)
        self._end_unstarted(job, "Cancelled before it started.")
        self._announce_queue(waiting)

    # -- what is going on ---------------------------------------------------------------------------
    def status(self) -> dict:
        with self._cond:
            return {
                "queued": len(self._queue),
                "active": self._together.running() if self._together is not None else 0,
                "running": self._running.label if self._running else None,
                "model": self.target.name if self.target is not None else None,
                "compile": self.target.compile_status() if self.target is not None else None,
            }

    def _wait_reason(self, ahead: list) -> str:
        """Why a request with ``ahead`` before it waits: the job that has the engine (or will have it first),
        or a full batch."""
        running = self._running
        if running is not None:
            return f"waiting for {running.label}" if running.label else "waiting for the engine"
        exclusive = next((j for j in ahead if self._how(j) == "exclusive"), None)
        if exclusive is not None:
            return f"waiting for {exclusive.label}" if exclusive.label else "waiting for another request to finish"
        together = self._together
        if together is not None and not self.admission.has_room(together):
            return self.admission.full_reason(together)
        return "waiting in line"

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """True once the engine exists on its thread (made with the first request; or it failed to start: see
        ``engine_error``)."""
        return self._ready.wait(timeout)

    # -- stopping -----------------------------------------------------------------------------------
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def shutdown(self, timeout: Optional[float] = 5.0) -> bool:
        """Cancel everything running or queued and stop the thread; True if it stopped within ``timeout``."""
        with self._cond:
            self._stopping = True
            jobs = list(self._queue)
            if self._running is not None:
                jobs.append(self._running)
            self._cond.notify_all()
        for job in jobs:
            job.handle.cancel()
        if self._together is not None:
            self._together.cancel_running("Stopped: Redline is closing.")
        if not self._thread.is_alive():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the scheduler thread -----------------------------------------------------------------------
    def _ensure_engine(self) -> None:
        """The Engine is made on this thread when the first request arrives (torch imports then, not at start)."""
        if self.engine is not None or self.engine_error is not None:
            return
        try:
            if self._engine_factory is None:
                self.engine = Engine()
            else:
                self.engine = self._engine_factory()

            # The admission's limits are the batch's: how many replies at once, the KV positions they may hold.
            self.engine.limits = BatchLimits(self.admission.max_active, self.admission.kv_budget_tokens)
        except Exception as exc:  # pragma: no cover - only if torch itself is broken
            self.engine_error = exc
        finally:
            self._ready.set()

    def _main(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start()
        while True:
            with self._cond:
                while not self._queue and not self._batch_busy() and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._batch_busy():
                    leftover = list(self._queue)
                    self._queue.clear()
                    break
            try:
                self._step()
            except Exception as exc:  # a fault of the scheduler itself: fail what it held, never stop serving
                self._fail_batch(exc)
        for job in leftover:
            self._end_unstarted(job, "Redline is closing.")
        # Quitting with a model loaded: its conversations stay warm for the next start (pages on disk).
        if self.target is not None:
            try:
                self.target.persist_prefix_cache()
            except Exception:  # a disk that fails costs the next start's warm cache, never the quit
                pass

    def _fail_batch(self, exc: BaseException) -> None:
        together, self._together = self._together, None
        if together is not None:
            together.fail_running(
                RedlineError(
                    f"The engine failed while serving this request ({type(exc).__name__}: {exc}).",
                    "Try again; if it happens again, report it.",
                )
            )

    def _batch_busy(self) -> bool:
        return self._together is not None and self._together.running() > 0

    def _step(self) -> None:
        self._ensure_engine()
        self._drop_cancelled()
        head = self._queue[0] if self._queue else None
        how = self._how(head)
        if head is not None and head.interrupt and self._batch_busy():
            self._together.cancel_running(f"Stopped so that {head.label or 'another task'} could start.")
        while head is not None and how == "batch":
            target = self._together = self.target
            if not self.admission.has_room(target):
                break
            try:
                if head.prepared is None:
                    head.prepared = self.admission.admit(head.request, target)
            except Exception as exc:  # it can never run (too long for the KV memory, the context …): said now
                self._pop(head)
                head.handle.fail(exc)
                head = self._queue[0] if self._queue else None
                how = self._how(head)
                continue
            why = self.admission.wait_reason(head.prepared, target)
            if why is not None:
                said = [e for e in head.handle.history() if isinstance(e, Queued)]
                if not said or said[-1].reason != why:
                    head.handle.emit(Queued(target.running(), why))
                break  # the running requests' KV memory comes back as they end
            self._pop(head)
            try:
                target.add(head.handle, head.request, head.submitted, head.prepared)
            except Exception as exc:
                head.handle.fail(exc)
            head = self._queue[0] if self._queue else None
            how = self._how(head)
        if self._batch_busy():  # an exclusive job at the head waits for the running replies to end
            self._together.step()
            return
        if head is not None and how != "batch":
            with self._cond:
                self._running = head  # before the queue hears it moved up: they wait for this job, not "in line"
            self._pop(head)
            self._run_exclusive(head)

    def _how(self, job: Optional[_Job]) -> Optional[str]:
        """How ``job`` runs (admission.py): "batch" or "exclusive"; None for no job. A generation's strategy is
        resolved here, before admission, and kept on the job."""
        if job is None:
            return None
        target = self.target
        if job.request is None or target is None:
            return "exclusive"
        try:
            job.request = target.resolved(job.request)
            return self.admission.how(job.request, target)
        except Exception:  # e.g. a strategy the target cannot run: its exclusive run says why
            return "exclusive"

    def _wait(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait(seconds)

    def _pop(self, job: _Job) -> None:
        with self._cond:
            self._queue.remove(job)
            waiting = list(self._queue)
        self._announce_queue(waiting)

    def _announce_queue(self, waiting: list) -> None:
        for i, other in enumerate(waiting):  # everyone behind moves up
            other.handle.emit(Queued(i + (1 if self._batch_busy() else 0), self._wait_reason(waiting[:i])))

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [job for job in self._queue if job.handle.cancelled]
            for job in gone:
                self._queue.remove(job)
        for job in gone:
            self._end_unstarted(job, "Cancelled before it started.")

    def _end_unstarted(self, job: _Job, why: str) -> None:
        if job.request is None:
            job.handle.fail(Cancelled(why))
            return
        job.handle.finish(
            GenerationResult(
                text="",
                token_ids=[],
                prompt_tokens=len(job.request.input_ids) if job.request.input_ids is not None else 0,
                new_tokens=0,
                finish_reason="cancelled",
                strategy=job.request.options.strategy,
                precision="",
                notes=[why],
            )
        )

    def _run_exclusive(self, job: _Job) -> None:
        with self._cond:
            self._running = job
        handle = job.handle
        handle.emit(Started())
        try:
            if self.engine is None:
                raise RedlineError(f"The engine could not start: {self.engine_error}")
            if job.request is not None:
                handle.finish(self.engine.run(job.request, handle, job.submitted))
            else:
                handle.complete(job.fn(self.engine, Reporter(handle)))
        except Exception as exc:  # the request's failure is its own; the service goes on
            handle.fail(exc)
        finally:
            with self._cond:
                self._running = None
            if self._together is not None and self._together is not self.target:
                self._together = None  # the model changed: the old one's batch goes with it


class Reporter:
    """What a job is handed to report with: ``report(obj)`` sends ``obj`` as an event of the job's handle;
    ``report.cancelled()`` says whether the job was asked to stop (its own cancel, no one else's)."""

    def __init__(self, handle: RequestHandle):
        self.handle = handle

    def __call__(self, obj: Any) -> None:
        self.handle.emit(obj)

    def cancelled(self) -> bool:
        return self.handle.cancelled


__all__ = ["Busy", "EngineService", "Refused", "Started"]
