"""Awaitable engine tasks on top of ``EngineThread``, for qasync slots.

``await client.run(task)`` resolves when the worker finishes the task. Token
events from the decode loop go through an ``EventChannel``: the worker appends
to a buffer and sends at most one wake-up signal until the UI has drained it, so
a fast model never floods the UI thread's event queue.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject

from .worker import EngineThread


class TaskFailed(Exception):
    """The task raised; ``str()`` is the message for the user, ``original`` the exception."""

    def __init__(self, message: str, original: BaseException | None = None):
        super().__init__(message)
        self.original = original


class EventChannel:
    """Many events from the worker, few wake-ups on the UI thread."""

    def __init__(self, on_events: Callable[[list], None]):
        self._on_events = on_events
        self._lock = threading.Lock()
        self._buffer: list = []
        self._woken = False
        self.report: Optional[Callable[[object], None]] = None
        # Set by the UI when the user stops this reply; the decode loop reads it every step. The engine's
        # own flag is cleared when a task starts, so a stop pressed while the reply still waited would be lost.
        self.cancelled = False

    def push(self, event) -> None:  # worker thread
        with self._lock:
            self._buffer.append(event)
            if self._woken:
                return
            self._woken = True
        self.report(self)

    def drain(self) -> None:  # UI thread
        with self._lock:
            events, self._buffer, self._woken = self._buffer, [], False
        if events:
            self._on_events(events)


class EngineClient(QObject):
    def __init__(self, thread: EngineThread, parent=None):
        super().__init__(parent)
        self.thread = thread
        self._pending: dict[int, tuple[asyncio.Future, Optional[Callable[[object], None]]]] = {}
        thread.progress.connect(self._on_progress)
        thread.done.connect(self._on_done)
        thread.failed.connect(self._on_failed)

    def run(self, fn, on_progress: Optional[Callable[[object], None]] = None) -> asyncio.Future:
        future = asyncio.get_event_loop().create_future()
        task_id = self.thread.submit(fn)
        self._pending[task_id] = (future, on_progress)
        return future

    def cancel(self) -> None:
        self.thread.cancel()

    def busy(self) -> bool:
        return bool(self._pending)

    def _on_progress(self, task_id: int, obj: Any) -> None:
        if isinstance(obj, EventChannel):
            obj.drain()
            return
        entry = self._pending.get(task_id)
        if entry and entry[1] is not None:
            entry[1](obj)

    def _on_done(self, task_id: int, value: Any) -> None:
        entry = self._pending.pop(task_id, None)
        if entry and not entry[0].done():
            entry[0].set_result(value)

    def _on_failed(self, task_id: int, message: str, exc: Any) -> None:
        entry = self._pending.pop(task_id, None)
        if entry and not entry[0].done():
            entry[0].set_exception(TaskFailed(message, exc))


# -- tasks (run on the worker thread; inference imports happen there, off the UI thread) --------


@dataclass
class LoadProgress:
    fraction: float
    phase: str


@dataclass
class ModelInfo:
    name: str
    device: str
    precision: str
    memory_bytes: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)
    draft_name: Optional[str] = None
    draft_error: Optional[str] = None
    # The estimator's prediction for what was loaded (target and draft, one token of context) and the
    # measured peak of the load it predicts (RSS on CPU; torch reserved + the CUDA context on GPUs).
    predicted_bytes: Optional[int] = None
    measured_bytes: Optional[int] = None


def load_task(
    model: str,
    precision: str,
    draft_model: Optional[str],
    draft_precision: str,
    with_draft: bool,
    is_trusted: Optional[Callable[[Any], bool]] = None,
):
    """``is_trusted(NeedsOptIn) -> bool`` says whether the user already opted in for that folder's code or
    pickle weights (as they are now); without it, such a model is refused with NeedsOptIn."""

    def task(engine, report):
        from redline.inference import Cancelled, RedlineError, resolve_precision

        share = 0.75 if (with_draft and draft_model) else 1.0
        spec = resolve_precision(precision, engine.device)
        loaded = engine.load(model, spec, lambda f, phase: report(LoadProgress(f * share, phase)), opt_in=is_trusted)
        info = ModelInfo(
            loaded.name,
            loaded.device,
            loaded.precision.label(),
            loaded.memory_bytes,
            loaded.load_seconds,
            list(loaded.notes),
        )
        if with_draft and draft_model:
            dspec = resolve_precision(draft_precision, engine.device)
            try:
                draft = engine.load_draft(
                    draft_model,
                    dspec,
                    lambda f, phase: report(LoadProgress(share + f * (1 - share), f"draft: {phase}")),
                )
                info.draft_name = draft.name
            except Cancelled:
                raise
            except RedlineError as exc:  # keep the target: the user can still chat without the draft
                info.draft_error = str(exc)
        else:
            engine.unload_draft()
        info.predicted_bytes, info.measured_bytes = _predicted_vs_measured(engine)
        report(LoadProgress(1.0, "Loaded"))
        return info

    return task


def _predicted_vs_measured(engine) -> tuple[Optional[int], Optional[int]]:
    from redline.inference import measured_peak_bytes, predict_loaded

    target, draft = engine.target, engine.draft
    try:
        measured = measured_peak_bytes(target, None, draft)
    except Exception:  # a report only: never fail a load over it
        measured = None
    if draft is None:
        return getattr(target, "predicted_bytes", None), measured
    try:
        return predict_loaded(target, 1, draft=draft).total_bytes, measured
    except Exception:
        return None, measured


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


def chat_task(messages: list[dict], sampling: dict, options: dict, context: Optional[int], channel: EventChannel):
    def task(engine, report):
        from redline.inference import DecodeOptions, SamplingSettings

        channel.report = report
        opts = dict(options)
        if opts.get("strategy") == "speculative" and engine.draft is None:
            from redline.inference import IncompatibleDraft

            raise IncompatibleDraft(
                "Speculative decoding needs a draft model, and none is loaded.",
                "Choose a draft model in Settings (a small model of the same family), "
                "or pick another strategy such as prompt-lookup.",
            )
        return engine.chat(
            messages,
            SamplingSettings(**sampling),
            DecodeOptions(**opts),
            on_event=channel.push,
            context=context,
            request_cancelled=lambda: channel.cancelled,
        )

    return task
