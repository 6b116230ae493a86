"""One reply through the tool loop, for the window: ``ToolRun`` runs ``run_tool_loop`` with a ``ServiceGenerator`` on
a worker thread of its own (``redline-tools``; the UI thread never waits on the engine or on a tool), and looks, to
the conversation's ``ChatSession``, like the bridge's ``Channel``: its ``events`` are the reply's text as it streams
(calls held back) and each round's other events as a plain reply's come (its speed readings, so the session feeds the
gauges as it does without tools; why it waits; its prompt being read), its rounds counted as one reply's (tokens
counted on, times from the first round's start), in batches on the UI thread, ending in a ``FinishedEvent`` — the
last round's figures, the whole reply's text — or ``Failed``; ``cancel()`` stops it; ``final_from_engine()`` answers
as Redline closes.

Each call the model makes is a dict (``calls``; ``calls_changed`` sends a copy to the UI thread whenever one
changes): its tool, server, arguments, state (asking, running, done, error, denied, stopped, not run), the
approval, its result (the first ``RESULT_CHARS`` characters) and time. A call the rules leave to the user waits on
the worker thread for ``answer(call_id, "yes" | "always" | "no")`` from the UI thread, or for a stop, which answers
"no". A stop during a call that hangs ends the reply at once: the worker goes on waiting for that call (bounded by
the call's timeout) and what it finds then is dropped."""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
import time
from typing import Any, Callable, Iterable, Optional

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from ...inference import (
    Failed,
    FinishedEvent,
    GenerationResult,
    Notice,
    PendingCall,
    ServiceGenerator,
    StatsEvent,
    run_tool_loop,
)
from ..signals import emit

RESULT_CHARS = 2_000  # of a call's result, kept with the reply and shown under its call (the model got up to 16,000)
STOP_RETRY_MS = 250  # a stop asked again this often while the generation it cancelled has not ended
STOP_WAIT_MS = 3_000  # then the reply ends without it
STOPPED = "Not run: the reply was stopped."
STOPPED_DURING = "Stopped: the reply was stopped while this call ran; its result was not given to the model."

ASKING, RUNNING, DONE, ERROR, DENIED, STOPPED_STATE, NOT_RUN = (
    "asking",
    "running",
    "done",
    "error",
    "denied",
    "stopped",
    "not run",
)
ANSWERS = {"yes": "allowed once", "always": "always allowed", "no": "denied"}


class _Ask:
    """A call waiting for the user's word (set from the UI thread)."""

    def __init__(self, call_id: str):
        self.call_id = call_id
        self.answer = "no"
        self.done = threading.Event()


@dataclasses.dataclass
class _Calls:
    calls: list


class ToolRun(QObject):
    """The tool loop for one reply: from ``messages`` (the conversation as the engine reads it) on ``engine`` (the
    ``EngineService``), with the tools ``service`` (``ToolsService``) offers now; ``request(messages)`` makes each
    round's GenerationRequest; at most ``max_rounds`` replies with calls; ``tokens``: what the definitions take (kept
    with the reply, None if not counted); ``unticked``: the tools the user took out of this conversation's offer."""

    events = Signal(object)  # a batch of events, in order; the last one ends with FinishedEvent or Failed
    calls_changed = Signal(object)  # a copy of ``calls`` after a change
    _wake = Signal()

    def __init__(
        self,
        service,
        engine,
        messages: list[dict],
        request: Callable[[list[dict]], Any],
        max_rounds: int = 8,
        tokens: Optional[int] = None,
        unticked: Iterable[str] = (),
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.unticked = frozenset(unticked)
        self.service, self.engine, self.messages, self.request = service, engine, list(messages), request
        self.max_rounds = max_rounds
        self.tokens = tokens
        self.calls: list[dict] = []  # changed on the worker thread, under the lock; read through copies
        self.final: Any = None  # the final event, once delivered here
        self.offered: list[str] = []
        self.errors: dict[str, str] = {}
        self.text = ""  # what the reply has shown so far (every round's, calls held back)
        self.loop = None  # the LoopResult, once the worker has it
        self.thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._buffer: list = []
        self._woken = False
        self._pending: Optional[_Ask] = None
        self._asked: set[str] = set()
        self._cancelled = threading.Event()
        self._phase = "starting"  # listing, generating, asking, calling, done
        self._round = 0
        self._separate = False
        self._generator: Optional[ServiceGenerator] = None
        self._registry = None
        self._last_result: Optional[GenerationResult] = None
        # The rounds as one reply to the gauges: each round's tokens counted after the earlier rounds', its times from
        # the first round's start (each round's engine times count from its own), the first TTFT kept.
        self._began: Optional[float] = None
        self._offset_s = 0.0
        self._tokens_before = 0
        self._ttft_ms: Optional[float] = None
        self._notices: set[str] = set()
        self._stop_timer = QTimer(self)
        self._stop_timer.setInterval(STOP_RETRY_MS)
        self._stop_timer.timeout.connect(self._stop_again)
        self._stop_ticks = 0
        self._wake.connect(self._drain, Qt.QueuedConnection)

    # -- what the window asks ---------------------------------------------------------------------------------------
    def start(self) -> "ToolRun":
        self.thread = threading.Thread(target=self._work, name="redline-tools", daemon=True)
        self.thread.start()
        return self

    @property
    def done(self) -> bool:
        return self.final is not None

    @property
    def waiting_for(self) -> Optional[str]:
        """The id of the call waiting for the user's word, if one is."""
        pending = self._pending
        return pending.call_id if pending is not None and not pending.done.is_set() else None

    def snapshot(self) -> list[dict]:
        """A copy of the calls as they stand."""
        with self._lock:
            return copy.deepcopy(self.calls)

    def answer(self, call_id: str, answer: str) -> None:
        """The user's word on the call ``call_id``: "yes" (this once), "always" or "no" (the UI thread)."""
        with self._lock:
            pending = self._pending
        if pending is not None and pending.call_id == call_id and not pending.done.is_set():
            pending.answer = answer if answer in ANSWERS else "no"
            pending.done.set()

    def cancel(self) -> None:
        """Stop: the generation running now is cancelled, a call waiting for the user is denied, no call starts; a
        call that is running is left to time out and the reply ends now."""
        if self.final is not None:
            return
        self._cancelled.set()
        with self._lock:
            pending = self._pending
        if pending is not None and not pending.done.is_set():
            pending.answer = "no"
            pending.done.set()
        if self._generator is not None:
            self._generator.cancel()
        if self._phase in ("starting", "listing", "calling"):
            self._finish_now()  # waiting on a server: the reply ends now, the worker's answer is dropped
        elif not self._stop_timer.isActive():
            self._stop_ticks = 0
            self._stop_timer.start()

    def final_from_engine(self) -> Any:
        """Redline closes: the final event, delivered or not yet; else the reply as it stands, stopped."""
        if self.final is not None:
            return self.final
        with self._lock:
            final = next((e for e in self._buffer if isinstance(e, (FinishedEvent, Failed))), None)
        if final is None:
            self._finished_early = True
            self._mark_stopped()
            final = FinishedEvent(self._stopped_result())
        self.final = final
        self._stop_timer.stop()
        return final

    def tool_stats(self) -> dict:
        """What is kept with the reply: each call (``tool_calls``), the tools offered and what they cost, and the
        messages the loop added (``tool_messages``: the next turn with tools shows the model its calls again)."""
        with self._lock:
            calls = copy.deepcopy(self.calls)
        tools: dict = {"offered": list(self.offered), "errors": dict(self.errors)}
        if self.tokens is not None:
            tools["tokens"] = self.tokens
        out: dict = {"tool_calls": calls, "tools": tools}
        loop = self.loop
        if loop is not None and self.final is not None and not self._finished_early:
            out["tool_messages"] = loop.messages
            out["tools_stopped"] = loop.stopped
        elif self._cancelled.is_set():
            out["tools_stopped"] = "cancelled"
        return out

    _finished_early = False  # the reply ended before the worker did (a stop while a call hung): its loop is not kept

    # -- the worker thread --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            self._phase = "listing"
            self.service.ensure_listed()  # servers not started yet start now (each bounded by its start timeout)
            registry = self.service.registry(self.unticked)
            self._registry = registry
            self.offered, self.errors = registry.names, dict(registry.errors)
            self._generator = ServiceGenerator(
                self.engine,
                registry.definitions(),
                self.request,
                tool_choice=self.service.tool_choice,
                on_event=self._on_event,
                on_progress=self._on_progress,
            )
            if self._cancelled.is_set():
                self._generator.cancel()
            self._phase = "generating"
            loop = run_tool_loop(
                self._generate,
                self.messages,
                registry,
                self.service.policy.approver(self._ask),
                max_rounds=self.max_rounds,
                should_cancel=self._cancelled.is_set,
                on_call=self._on_call,
                on_result=self._on_result,
            )
            self.loop = loop
            final: Any = FinishedEvent(self._result(loop))
        except BaseException as exc:  # the engine refused (busy, shutting down), a tool_choice not offered, a bug
            final = Failed(exc)
        self._phase = "done"
        self.messages = []  # the conversation (its attachments too): not kept past the reply
        self._post(final)

    def _generate(self, messages: list[dict], round_: int) -> GenerationResult:
        self._round = round_
        self._phase = "generating"
        self._separate = bool(self.text.strip())  # a later round's words start a paragraph of their own
        now = time.monotonic()
        self._began = now if self._began is None else self._began
        self._offset_s = now - self._began
        result = self._generator(messages, round_)
        self._last_result = result
        self._tokens_before += result.new_tokens
        return result

    def _on_event(self, ev) -> None:
        if self._separate and ev.text:
            ev = dataclasses.replace(ev, text="\n\n" + ev.text.lstrip("\n"))
            self._separate = False
        self.text += ev.text
        self._post(dataclasses.replace(ev, time_s=ev.time_s + self._offset_s))

    def _on_progress(self, ev) -> None:
        """A round's other events, to the session as a plain reply's come: its 1-second speed (the gauges), why it
        waits and its prompt being read (the reply's badge), a notice (once per reply, not once per round)."""
        if isinstance(ev, StatsEvent):
            if self._ttft_ms is None and ev.ttft_ms is not None:
                self._ttft_ms = ev.ttft_ms + self._offset_s * 1000
            ev = dataclasses.replace(ev, new_tokens=ev.new_tokens + self._tokens_before, ttft_ms=self._ttft_ms)
        elif isinstance(ev, Notice):
            if ev.text in self._notices:
                return
            self._notices.add(ev.text)
        self._post(ev)

    def _ask(self, call: PendingCall) -> str:
        ask = _Ask(call.id)
        with self._lock:
            entry = self._entry(call)
            entry["state"] = ASKING
            self._pending = ask
            self._asked.add(call.id)
        self._phase = "asking"
        self._post_calls()
        while not ask.done.wait(0.1):
            if self._cancelled.is_set():
                break
        answer = ask.answer if ask.done.is_set() and not self._cancelled.is_set() else "no"
        with self._lock:
            self._pending = None
            entry["approval"] = ANSWERS[answer] if not self._cancelled.is_set() else "stopped"
            entry["state"] = RUNNING if answer != "no" else (STOPPED_STATE if self._cancelled.is_set() else DENIED)
        self._post_calls()
        return answer

    def _on_call(self, call: PendingCall) -> None:
        self._phase = "calling"
        with self._lock:
            entry = self._entry(call)
            entry["state"] = RUNNING
            if call.id not in self._asked:
                entry["approval"] = "allowed by your rules"
        self._post_calls()

    def _on_result(self, record) -> None:
        with self._lock:
            arguments = record.arguments if isinstance(record.arguments, dict) else {}
            entry = self._entry(PendingCall(record.name, arguments, record.server, id=record.id))
            entry["arguments"] = record.arguments
            entry.update(
                result=record.result[:RESULT_CHARS],
                result_chars=len(record.result),
                is_error=bool(record.is_error),
                ms=round(record.ms, 1),
                round=record.round,
            )
            if record.ran:
                entry["state"] = ERROR if record.is_error else DONE
            elif self._cancelled.is_set():
                entry["state"], entry["approval"] = STOPPED_STATE, entry["approval"] or "stopped"
            elif record.id in self._asked:
                entry["state"] = DENIED
            elif not record.is_error and self.service.policy.decide(PendingCall(record.name, {}, record.server)) == (
                "deny"
            ):
                entry["state"], entry["approval"] = DENIED, "denied by your rules"
            else:
                entry["state"] = NOT_RUN
        self._phase = "generating"
        self._post_calls()

    def _entry(self, call: PendingCall) -> dict:
        """The call's dict (made the first time it is seen); the lock is held."""
        for c in self.calls:
            if call.id and c["id"] == call.id:
                return c
        found = self._registry.get(call.name) if self._registry is not None else None
        shown: Any = call.arguments
        if not call.arguments and (call.raw_arguments or "").strip():
            try:
                parsed = json.loads(call.raw_arguments)
            except ValueError:
                parsed = None
            shown = {} if isinstance(parsed, dict) else call.raw_arguments  # not a JSON object: the text it was
        entry = {
            "id": call.id,
            "name": call.name,
            "server": call.server or (found.server if found is not None else None),
            "tool": found.tool if found is not None else call.name,
            "arguments": shown,
            "state": RUNNING,
            "approval": "",
            "result": "",
            "result_chars": 0,
            "is_error": False,
            "ms": 0.0,
            "round": self._round,
        }
        self.calls.append(entry)
        return entry

    def _result(self, loop) -> GenerationResult:
        """The reply's result: the last round's figures, with all the text the reply showed."""
        final = loop.final if loop.final is not None else self._empty()
        notes = list(final.notes) + [n for n in (self._generator.notes if self._generator else []) if n]
        finish = "cancelled" if loop.stopped == "cancelled" and final.finish_reason != "error" else final.finish_reason
        if loop.stopped == "max_rounds":
            notes.append(
                f"The tool calls stopped after {self.max_rounds} replies with calls (Settings → Tools: most tool calls "
                "per reply); the last reply's calls did not run."
            )
        return dataclasses.replace(final, text=self.text, tool_calls=[], finish_reason=finish, notes=notes)

    def _empty(self) -> GenerationResult:
        strategy = getattr(getattr(self.request([]), "options", None), "strategy", "")
        return GenerationResult("", [], 0, 0, "cancelled", strategy or "", "")

    # -- to the UI thread -------------------------------------------------------------------------------------------
    def _post_calls(self) -> None:
        with self._lock:
            snapshot = copy.deepcopy(self.calls)
        self._post(_Calls(snapshot))

    def _post(self, item) -> None:
        with self._lock:
            self._buffer.append(item)
            if self._woken:
                return
            self._woken = True
        try:
            emit(self._wake)
        except RuntimeError:  # the window is gone (a thread that waited out a hung call after it closed)
            pass

    @Slot()
    def _drain(self) -> None:  # the UI thread
        with self._lock:
            items, self._buffer, self._woken = self._buffer, [], False
        batch: list = []
        for item in items:
            if self.final is not None:
                return
            if isinstance(item, _Calls):
                if batch:
                    emit(self.events, batch)
                    batch = []
                emit(self.calls_changed, item.calls)
                continue
            batch.append(item)
            if isinstance(item, (FinishedEvent, Failed)):
                self.final = item
                self._stop_timer.stop()
        if batch:
            emit(self.events, batch)

    # -- stopping --------------------------------------------------------------------------------------------------
    def _stop_again(self) -> None:
        """A generation cancelled just as it was submitted may not have heard it: ask again, and after a while end
        the reply without it."""
        if self.final is not None:
            self._stop_timer.stop()
            return
        self._stop_ticks += 1
        if self._generator is not None:
            self._generator.cancel()
        if self._phase in ("calling", "listing") or self._stop_ticks * STOP_RETRY_MS >= STOP_WAIT_MS:
            self._finish_now()

    def _finish_now(self) -> None:
        """End the reply now, as it stands (the UI thread)."""
        if self.final is not None:
            return
        self._stop_timer.stop()
        self._finished_early = True
        calls = self._mark_stopped()
        self.final = FinishedEvent(self._stopped_result())
        emit(self.calls_changed, calls)
        emit(self.events, [self.final])

    def _mark_stopped(self) -> list:
        with self._lock:
            for c in self.calls:
                if c["state"] in (ASKING, RUNNING):
                    c["state"] = STOPPED_STATE
                    c["approval"] = c["approval"] or "stopped"
                    c["result"] = c["result"] or (STOPPED_DURING if c["approval"] != "stopped" else STOPPED)
            return copy.deepcopy(self.calls)

    def _stopped_result(self) -> GenerationResult:
        base = self._last_result or self._empty()
        return dataclasses.replace(base, text=self.text, tool_calls=[], finish_reason="cancelled")
