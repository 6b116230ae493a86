"""What the speed model predicts before Run: each row's tokens/s here (asked on the engine thread between runs, a
moment after the last edit, and shown in the configuration table) and how long the whole run will take (said
under Run)."""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QLabel

from ...inference import Failed, RedlineError, SpeedPrediction, predictions_job
from ..bridge import EngineBridge, user_message
from .form import SetupForm

PREDICT_DELAY_MS = 400  # predictions are asked this long after the last edit
LABEL = "the speed lab's predictions"  # what a request queued behind them says it waits for


def _duration(seconds: float) -> str:
    """A predicted duration as a person says it: "40 s", "about 1 min", "12 min"."""
    if seconds < 55:
        return f"{max(1, round(seconds / 5) * 5):.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1.5 else "1 min"


class Predictions(QObject):
    """``form``: what is predicted; ``duration_label``: where the run's duration is said; ``busy()``: a run is
    going on (questions wait for its end, when the run has taught the speed model)."""

    def __init__(
        self,
        bridge: EngineBridge,
        form: SetupForm,
        duration_label: QLabel,
        busy: Callable[[], bool],
        parent: Optional[QObject] = None,
    ):
        super().__init__(parent)
        self.bridge, self.form, self.duration_label, self._busy = bridge, form, duration_label, busy
        self._asking = None  # the predictions asked of the engine thread: their channel, while it runs
        self._again = False
        self._asked_for = None  # (model, row labels, new tokens) of the last question
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(PREDICT_DELAY_MS)
        self.timer.timeout.connect(self.request)
        editor = form.configs_editor
        editor.changed.connect(self.timer.start)
        form.model_edit.textChanged.connect(lambda _t: self.timer.start())
        form.new_tokens_spin.valueChanged.connect(lambda _v: self.timer.start())
        for spin in (form.warmup_spin, form.samples_spin):
            spin.valueChanged.connect(lambda _v: self.show_duration())
        form.prompts_combo.currentTextChanged.connect(lambda _t: self.show_duration())
        editor.changed.connect(self.show_duration)

    def later(self) -> None:
        """Ask again a moment from now (a run ended: it taught the speed model)."""
        self.timer.start()

    def predicting(self) -> bool:
        """Predictions are being asked of the engine thread, or are due to be asked."""
        return self._asking is not None or self.timer.isActive()

    # -- asking ---------------------------------------------------------------------------------
    def request(self):
        """Ask the speed model for each row's tokens/s here; answered in ``_on_predictions``."""
        if self._busy() or self._asking is not None:
            self._again = True  # after the run (or the question already asked)
            return None
        self._again = False
        try:
            configs = self.form.configs_editor.validated()
        except RedlineError:
            return None
        model, new_tokens = self.form.model(), self.form.new_tokens_spin.value()
        self._asked_for = (model, [c.label for c in configs], new_tokens)
        self._asking = ask = self.bridge.run(
            predictions_job(model, configs, self.form.prompt_tokens_guess(), new_tokens), label=LABEL
        )
        ask.events.connect(lambda events, a=ask: self._on_events(a, events))
        return ask

    def _asked_for_now(self) -> bool:
        """Were the predictions that came back asked for the rows, model and length shown now?"""
        form = self.form
        now = (form.model(), [c.label for c in form.configs_editor.configs()], form.new_tokens_spin.value())
        return self._asked_for == now

    def _on_events(self, ask, events: list) -> None:
        if ask is not self._asking or not ask.done:
            return
        self._asking = None
        final = events[-1]
        if isinstance(final, Failed):
            self._on_failed(user_message(final.error), final.error)
        else:
            self._on_predictions(final.value)

    def _on_predictions(self, predictions) -> None:
        if self._asked_for_now():
            self.form.configs_editor.set_predictions(list(predictions))
            self.show_duration()
        else:  # the rows changed while the engine thread answered: ask again for what is shown
            self._again = True
        if self._again:
            self.timer.start()

    def _on_failed(self, message: str, exc) -> None:
        if isinstance(exc, RedlineError) and "shutting down" in str(exc):
            return  # the window is closing: predictions are only a hint
        editor = self.form.configs_editor
        if self._asked_for_now():
            editor.set_predictions([f"Cannot predict: {message}"] * len(editor.configs()))
        else:
            self.timer.start()

    # -- how long the run takes -------------------------------------------------------------------
    def predicted_seconds(self) -> tuple[Optional[float], int]:
        """The run's predicted seconds over the rows the speed model predicts (TTFT plus the new tokens at the
        predicted tokens/s, per generation), without loading; and how many rows it cannot predict."""
        n = self.form.generations_per_row()
        new_tokens = self.form.new_tokens_spin.value()
        editor = self.form.configs_editor
        total, unknown = 0.0, 0
        rows = editor.configs()
        for r in range(len(rows)):
            p = editor.prediction(r)
            if isinstance(p, SpeedPrediction) and p.tokens_per_s > 0:
                total += n * (p.ttft_ms / 1000 + new_tokens / p.tokens_per_s)
            else:
                unknown += 1
        return (total if unknown < len(rows) else None), unknown

    def show_duration(self) -> None:
        """Say before Run how long it is predicted to take."""
        seconds, unknown = self.predicted_seconds()
        rows = len(self.form.configs_editor.configs())
        if not rows:
            self.duration_label.setText("")
            return
        n = self.form.generations_per_row()
        what = f"{rows} configuration{'s' if rows != 1 else ''} × {n} generations"
        if seconds is None:
            self.duration_label.setText(f"Run: {what}; its duration cannot be predicted here.")
            return
        text = f"Run is predicted to take about {_duration(seconds)} ({what}, plus loading each precision)"
        if unknown:
            text += f"; {unknown} of them cannot be predicted and add to it"
        self.duration_label.setText(text + ".")
