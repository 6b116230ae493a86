"""Awaitable engine requests on top of ``EngineThread``, for qasync slots.

``await client.run(task)`` resolves when the engine has run the job; ``await client.generate(request,
on_events)`` when the generation ends, with ``on_events(list)`` called on the UI thread as its events arrive.
Each returns a future whose ``request_id`` cancels that request alone (``client.cancel(future)``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject

from redline.inference import LoadReport, LoadRequest, Progress

from .worker import EngineThread


class TaskFailed(Exception):
    """The request failed; ``str()`` is the message for the user, ``original`` the exception."""

    def __init__(self, message: str, original: BaseException | None = None):
        super().__init__(message)
        self.original = original


class EngineClient(QObject):
    def __init__(self, thread: EngineThread, parent=None):
        super().__init__(parent)
        self.thread = thread
        self._pending: dict[int, tuple[asyncio.Future, Optional[Callable[[list], None]]]] = {}
        thread.events.connect(self._on_events)
        thread.done.connect(self._on_done)
        thread.failed.connect(self._on_failed)

    def run(
        self, fn, on_progress: Optional[Callable[[object], None]] = None, label: str = "", interrupt: bool = False
    ) -> asyncio.Future:
        """Run the job ``fn(engine, report)``; ``on_progress(obj)`` for each object it reports."""
        each = (lambda events: [on_progress(ev) for ev in events]) if on_progress is not None else None
        return self._track(lambda: self.thread.submit(fn, label, interrupt), each)

    def generate(self, request, on_events: Optional[Callable[[list], None]] = None) -> asyncio.Future:
        """Queue a generation; the future's result is its GenerationResult (raises TaskFailed if it cannot be
        taken or fails)."""
        return self._track(lambda: self.thread.submit_generation(request), on_events)

    def _track(self, submit, on_events) -> asyncio.Future:
        future = asyncio.get_event_loop().create_future()
        future.request_id = None
        try:
            future.request_id = submit()
        except Exception as exc:  # Busy, Refused, or the engine shutting down: said at once, as a failure
            from .worker import user_message

            future.set_exception(TaskFailed(user_message(exc), exc))
            return future
        self._pending[future.request_id] = (future, on_events)
        return future

    def cancel(self, future: Optional[asyncio.Future]) -> None:
        """Stop the request behind ``future`` (and nothing else)."""
        request_id = getattr(future, "request_id", None)
        if request_id is not None:
            self.thread.cancel(request_id)

    def busy(self) -> bool:
        return bool(self._pending)

    def _on_events(self, request_id: int, events: list) -> None:
        entry = self._pending.get(request_id)
        if entry and entry[1] is not None:
            entry[1](events)

    def _on_done(self, request_id: int, value: Any) -> None:
        entry = self._pending.pop(request_id, None)
        if entry and not entry[0].done():
            entry[0].set_result(value)

    def _on_failed(self, request_id: int, message: str, exc: Any) -> None:
        entry = self._pending.pop(request_id, None)
        if entry and not entry[0].done():
            entry[0].set_exception(TaskFailed(message, exc))


# -- tasks (run on the worker thread; inference imports happen there, off the UI thread) --------

# What a load reports and returns: the engine's own (``EngineService.load`` / ``Engine.load_all``).
LoadProgress = Progress
ModelInfo = LoadReport


def load_task(
    model: str,
    precision: str,
    draft_model: Optional[str],
    draft_precision: str,
    with_draft: bool,
    is_trusted: Optional[Callable[[Any], bool]] = None,
    api_key: Optional[str] = None,
):
    """The engine's one load job (``Engine.load_all``) as a task: ``is_trusted(NeedsOptIn) -> bool`` says whether
    the user already opted in for that folder's code or pickle weights; a server's address connects to its model,
    with ``api_key``."""
    request = LoadRequest(model, precision, draft_model if with_draft else None, draft_precision, api_key, is_trusted)

    def task(engine, report):
        return engine.load_all(request, report, should_cancel=getattr(report, "cancelled", None))

    return task


# -- what the configuration wizard asks the engine thread (torch and tokenizers load there) ------


def describe_task(spec: str):
    """Validate a model choice and read its shape (``redline.inference.describe_model``)."""

    def task(engine, report):
        from redline.inference import describe_model

        return describe_model(spec)

    return task


@dataclass
class MachineInfo:
    hardware: Any  # inference.hardware.probe.HardwareInfo
    target: Any  # inference.memory.fit.Target: the memory to plan with on this machine
    correction_bytes: int  # the estimator's correction learned on this machine
    reclaimable_bytes: int  # what the model loaded now gives back when replaced
    device: str


def hardware_task():
    def task(engine, report):
        from redline.inference import correction_bytes, detect_target, probe_machine

        reclaimable = sum(m.memory_bytes for m in (engine.target, engine.draft) if m is not None)
        hardware = probe_machine()
        target = detect_target(reclaimable_bytes=reclaimable, device=engine.device)
        correction = correction_bytes(target.device, key=target.calibration_key) if target.calibration_key else 0
        return MachineInfo(hardware, target, correction, reclaimable, engine.device)

    return task


def pair_task(target_spec: str, draft_spec: str):
    """Whether the draft pairs with the target, from configs and tokenizers (``inference.decoding.draft_check``)."""

    def task(engine, report):
        from redline.inference import check_pair

        return check_pair(target_spec, draft_spec)

    return task


def unload_task():
    """Free the model and draft (weights, caches, allocator pages) on the engine thread."""

    def task(engine, report):
        engine.unload()
        return None

    return task
