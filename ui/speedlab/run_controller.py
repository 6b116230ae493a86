"""The speed lab's run: ``run_bench`` submitted to the engine service as one job through the window's
``EngineBridge`` (it has the engine to itself while it runs: chat replies asked meanwhile wait, and say so); its
channel brings back its progress events (phases, output tokens, finished rows), ending in the report. Cancel stops
this run and nothing else.

While it runs, the outputs stream into their columns, finished rows reach the results, and the signals
(``row_started``, ``live_speed``, ``token_latencies``, ``row_done``, ``run_finished``) let the window's gauges
follow it. The finished run is kept among the saved runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton

from ...inference import (
    BenchLive,
    BenchPhase,
    BenchRow,
    BenchSpec,
    BenchStarted,
    BenchSweepRow,
    BenchToken,
    Cancelled,
    Completed,
    Failed,
    Queued,
    RedlineError,
    Started,
    run_bench,
)
from ..bridge import EngineBridge, user_message
from ..signals import emit
from .form import SetupForm
from .outputs import OutputColumns
from .results import ResultsView
from .saved_runs import SavedRuns

LABEL = "the speed lab"  # what a chat reply asked meanwhile says it waits for
WAIT_CHECK_MS = 500  # how often a run not started yet looks at what has the engine


def nothing_ran(report) -> bool:
    """A cancelled run in which no row measured, failed or swept anything: there is nothing to keep."""
    return (
        report.cancelled
        and not report.sweep
        and all(r.status == "cancelled" and r.tokens_per_s is None and r.ttft_ms is None for r in report.results)
    )


@dataclass
class RunControls:
    """Run, Cancel, the progress bar and the status line under the form."""

    run_button: QPushButton
    cancel_button: QPushButton
    progress_bar: QProgressBar
    status_label: QLabel

    def say(self, text: str) -> None:
        self.status_label.setText(text)


class RunController(QObject):
    """``form``: the run to make; ``controls``: where it is started, stopped and told; ``outputs``, ``results``,
    ``saved``: where it shows and keeps what it measures; ``ran()``: called when a run ends (the predictions ask
    again: the run taught the speed model)."""

    run_finished = Signal(object)  # BenchReport
    row_started = Signal(str)  # the row's label
    live_speed = Signal(float, object, int)  # tokens/s over the last second, TTFT ms (or None), new tokens
    row_done = Signal(object)  # ConfigResult
    token_latencies = Signal(list)  # ms between the streamed tokens of the column shown

    def __init__(
        self,
        bridge: EngineBridge,
        form: SetupForm,
        controls: RunControls,
        outputs: OutputColumns,
        results: ResultsView,
        saved: SavedRuns,
        ran: Callable[[], None],
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.bridge, self.form, self.controls = bridge, form, controls
        self.outputs, self.results, self.saved, self._ran = outputs, results, saved, ran
        self._run = None  # the run going on: its channel
        self._waiting = False  # submitted, not started by the engine yet
        self._queued_reason = ""  # why it waits, as the engine said (a Queued event), or ""
        self._wait_timer = QTimer(self)
        self._wait_timer.setInterval(WAIT_CHECK_MS)
        self._wait_timer.timeout.connect(self._say_why_waiting)
        self._live_index: Optional[int] = None
        self._last_token_s: dict[int, float] = {}

    def running(self) -> bool:
        return self._run is not None

    def start(self):
        """Validate the form and submit the run (its channel); bad input is reported and nothing is lost."""
        if self._run is not None:
            return None
        c = self.controls
        try:
            spec = self.form.build_spec()
        except RedlineError as exc:
            c.say(f"<b>Cannot run:</b> {exc}")
            return None
        self.reset_outputs(spec)
        self.results.clear()
        c.run_button.setEnabled(False)
        c.cancel_button.setEnabled(True)
        c.progress_bar.setValue(0)
        c.say("Starting…")

        def task(engine, report):
            return run_bench(engine, spec, report, report.cancelled, restore_model=True)

        self._run = run = self.bridge.run(task, label=LABEL)
        run.events.connect(lambda events, r=run: self._on_events(r, events))
        self._set_waiting(True)
        self._queued_reason = ""
        self._say_why_waiting()
        return run

    def cancel(self) -> None:
        """Stop this run after the current step (a chat reply is never touched)."""
        if self._run is not None:
            self._run.cancel()
        self._wait_timer.stop()  # a run still waiting ends at once; its own words follow
        self.controls.say("Cancelling after the current step…")

    def reset_outputs(self, spec: BenchSpec) -> None:
        self.outputs.reset(
            [c.label + ("  (baseline)" if i == spec.baseline else "") for i, c in enumerate(spec.configs)]
        )
        self.form.configs_editor.clear_measured()
        self._live_index = None
        self._last_token_s = {}

    # -- waiting for the engine ------------------------------------------------------------------
    def _set_waiting(self, waiting: bool) -> None:
        """Until the engine takes the run up, the bar reads "waiting" (not "0%") and the status says why."""
        self._waiting = waiting
        self.controls.progress_bar.setFormat("waiting" if waiting else "%p%")
        if waiting:
            self._wait_timer.start()
        else:
            self._wait_timer.stop()

    def _say_why_waiting(self) -> None:
        """What the run waits for: the engine's reason when it sent one (a job or a chat reply that has the engine
        to itself, or will have it first), and the replies being written together on the fast path, which it lets
        end first (the engine sends no reason for those)."""
        if not self._waiting:
            return
        status = self.bridge.status()
        replies, running = status.get("active") or 0, status.get("running")
        why = [self._queued_reason] if self._queued_reason else []
        if not why and running and running != LABEL:
            why.append(f"waiting for {running}")
        if replies:
            these = "1 reply is" if replies == 1 else f"{replies} replies are"
            why.append(f"{these} being written; the lab runs when they end (it needs the engine to itself)")
        if why:
            self.controls.say(f"Waiting to start: {'; '.join(why)}.")

    # -- what the run reports ------------------------------------------------------------------
    def _on_events(self, run, events: list) -> None:
        if run is not self._run:
            return
        for ev in events:
            if isinstance(ev, Completed):
                self._on_done(ev.value)
            elif isinstance(ev, Failed):
                self._on_failed(ev.error)
            else:
                self.on_progress(ev)

    def on_progress(self, ev) -> None:
        if isinstance(ev, Queued):  # a chat reply (or a load) has the engine: the run waits, and says so
            self._queued_reason = ev.reason or "waiting in line"
            self._say_why_waiting()
        elif isinstance(ev, Started):  # the engine took the run up
            self._set_waiting(False)
            self.controls.say("Starting…")
        elif isinstance(ev, BenchToken):
            col = self.outputs.column(ev.index)
            if col is not None:
                col.append(ev.text)
            if ev.time_s is not None:
                last = self._last_token_s.get(ev.index)
                if last is not None and ev.time_s > last:
                    emit(self.token_latencies, [(ev.time_s - last) * 1000.0])
                self._last_token_s[ev.index] = ev.time_s
        elif isinstance(ev, BenchLive):
            col = self.outputs.column(ev.index)
            if col is not None:
                col.live(ev.tokens_per_s_1s)
            emit(self.live_speed, ev.tokens_per_s_1s, ev.ttft_ms, ev.new_tokens)
        elif isinstance(ev, BenchPhase):
            self.controls.progress_bar.setValue(int(ev.fraction * 1000))
            self.controls.say(ev.phase)
            col = self.outputs.column(ev.index) if ev.index is not None else None
            if col is not None:
                col.running(ev.phase.rpartition(": ")[2] if ": " in ev.phase else ev.phase)
            if ev.index is not None and ev.index != self._live_index:
                self._live_index = ev.index
                emit(self.row_started, ev.phase.split(": ")[0])
        elif isinstance(ev, BenchRow):
            r = ev.result
            self.results.add_row(r)
            col = self.outputs.column(r.index)
            if col is not None:
                col.finish(r)
            self.form.configs_editor.set_measured(r.index, r)
            emit(self.row_done, r)
        elif isinstance(ev, BenchSweepRow):
            self.results.add_sweep_row(ev.row)
        elif isinstance(ev, BenchStarted):
            self.results.sweep_started()

    def _ended(self) -> None:
        self._run = None
        self._set_waiting(False)
        self.controls.run_button.setEnabled(True)
        self.controls.cancel_button.setEnabled(False)

    def _on_done(self, report) -> None:
        self._ended()
        if nothing_ran(report):  # cancelled before any row measured: no 100 %, no empty run saved
            self.controls.progress_bar.setValue(0)
            self.results.clear()
            self.form.configs_editor.clear_measured()
            self.controls.say("Cancelled before any configuration ran: nothing was saved.")
            self._ran()
            return
        self.controls.progress_bar.setValue(1000)
        self.results.show_reports([report])
        self._ran()
        saved = self.saved.save(report)
        self.controls.say(
            ("Cancelled; finished rows kept." if report.cancelled else f"Done in {report.seconds:.0f} s.") + saved
        )
        emit(self.run_finished, report)

    def _on_failed(self, exc: BaseException) -> None:
        self._ended()
        if isinstance(exc, Cancelled):  # cancelled while it waited for the engine: nothing ran, nothing failed
            self.outputs.reset([])  # no column goes on saying "waiting"
            self.controls.say("Cancelled before it started: nothing ran.")
        else:
            self.controls.say(f"<b>The run failed:</b> {user_message(exc)}")
        self._ran()
